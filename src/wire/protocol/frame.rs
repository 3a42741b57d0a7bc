//! The protocol's framing (src/wire/protocol.rs): the 12-byte preamble each way (magic,
//! version), then frames of a 4-byte little-endian length and that many bytes of one JSON
//! message; what a broken or foreign peer reads as (`WireError`).

use super::{Msg, MAGIC, MAX_FRAME, VERSION};
use std::io::{Read, Write};

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the other side does not speak the dflash-top protocol (no dflash-top preamble): give the socket of a `dflash-top train` or a dflash_top Python pipeline")]
    NotDflash,
    #[error("protocol version mismatch: this dflash-top speaks version {ours}, the other side version {theirs}; use the same dflash-top release (and python/dflash_top) on both sides")]
    Version { ours: u32, theirs: u32 },
    #[error("a frame of {0} bytes exceeds the protocol's limit of {MAX_FRAME} bytes")]
    TooLarge(usize),
    #[error("a malformed frame: {0}")]
    Malformed(String),
    #[error("the connection closed in the middle of a frame")]
    Truncated,
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub fn write_preamble(w: &mut impl Write) -> std::io::Result<()> {
    write_preamble_version(w, VERSION)
}

/// The preamble with any version (tests speak a future one).
pub fn write_preamble_version(w: &mut impl Write, version: u32) -> std::io::Result<()> {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&MAGIC);
    b[8..].copy_from_slice(&version.to_le_bytes());
    w.write_all(&b)?;
    w.flush()
}

/// Reads the other side's preamble; a wrong magic or version is an error that says so.
pub fn read_preamble(r: &mut impl Read) -> Result<(), WireError> {
    let mut b = [0u8; 12];
    r.read_exact(&mut b).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => WireError::NotDflash,
        _ => WireError::Io(e),
    })?;
    if b[..8] != MAGIC {
        return Err(WireError::NotDflash);
    }
    let theirs = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if theirs != VERSION {
        return Err(WireError::Version {
            ours: VERSION,
            theirs,
        });
    }
    Ok(())
}

/// One message as a frame: length, then JSON.
pub fn encode(m: &Msg) -> Vec<u8> {
    let body = serde_json::to_vec(m).expect("wire messages always serialize");
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

pub fn write_msg(w: &mut impl Write, m: &Msg) -> std::io::Result<()> {
    w.write_all(&encode(m))
}

/// The next message; None at a clean end of stream (between frames).
pub fn read_msg(r: &mut impl Read) -> Result<Option<Msg>, WireError> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(WireError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(WireError::TooLarge(n));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => WireError::Truncated,
        _ => WireError::Io(e),
    })?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| WireError::Malformed(e.to_string()))
}
