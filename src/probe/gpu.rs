//! GPUs through NVML (nvml-wrapper). Absent NVML is a normal state: the probe says so in one line.
//! Each NVML device is matched to this process's `cuda:N` (see `visible`), and carries this
//! process's own memory on it.

use super::visible::{cuda_to_nvml, nvml_to_cuda, DeviceId};
use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub name: String,
    /// SM utilisation: share of time a kernel ran, percent.
    pub util_pct: u32,
    /// Memory-bandwidth utilisation: share of time device memory was read or written, percent.
    pub mem_bw_pct: u32,
    pub mem_used_mib: u64,
    pub mem_total_mib: u64,
    /// This process's memory on the device; None when NVML does not list this pid (no context
    /// there, or a container whose pids NVML does not see).
    pub proc_mem_mib: Option<u64>,
    pub power_w: f64,
    pub sm_clock_mhz: u32,
    pub temp_c: u32,
    /// The `cuda:N` this device is in this process; None when CUDA_VISIBLE_DEVICES hides it.
    pub cuda: Option<u32>,
    /// Why the clocks are held down, short names (`idle`, `sw-power`, `hw-thermal`, …).
    pub throttle: Vec<String>,
}

/// An open NVML and, per NVML index, the `cuda:N` it is.
pub struct Gpus {
    nvml: Nvml,
    cuda_of: Vec<Option<u32>>,
    pid: u32,
}

pub enum GpuProbe {
    Present(Box<Gpus>),
    Absent(String),
}

/// Short names of the reasons NVML gives for clocks below their maximum.
pub fn throttle_names(r: ThrottleReasons) -> Vec<&'static str> {
    const NAMES: [(ThrottleReasons, &str); 9] = [
        (ThrottleReasons::GPU_IDLE, "idle"),
        (ThrottleReasons::APPLICATIONS_CLOCKS_SETTING, "app-clocks"),
        (ThrottleReasons::SW_POWER_CAP, "sw-power"),
        (ThrottleReasons::HW_SLOWDOWN, "hw-slowdown"),
        (ThrottleReasons::SYNC_BOOST, "sync-boost"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "sw-thermal"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "hw-thermal"),
        (ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN, "power-brake"),
        (ThrottleReasons::DISPLAY_CLOCK_SETTING, "display"),
    ];
    NAMES
        .iter()
        .filter(|(flag, _)| r.contains(*flag))
        .map(|(_, name)| *name)
        .collect()
}

/// UUID and bus id of every device, for matching.
fn device_ids(nvml: &Nvml) -> Result<Vec<DeviceId>, String> {
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count: {e}"))?;
    (0..count)
        .map(|i| {
            let d = nvml
                .device_by_index(i)
                .map_err(|e| format!("NVML device {i}: {e}"))?;
            Ok(DeviceId {
                nvml_index: i,
                uuid: d.uuid().unwrap_or_default(),
                pci_bus_id: d.pci_info().map(|p| p.bus_id).unwrap_or_default(),
            })
        })
        .collect()
}

/// PCI bus ids of `cuda:0`, `cuda:1`, … as this process's CUDA runtime numbers them.
fn runtime_bus_ids() -> Option<Vec<String>> {
    if !crate::cuda_shim::AVAILABLE {
        return None;
    }
    let n = tch::Cuda::device_count();
    (0..n)
        .map(|i| {
            crate::cuda_shim::device_pci(i as usize)
                .ok()
                .map(|(b, _)| b)
        })
        .collect::<Option<Vec<_>>>()
        .filter(|v| !v.is_empty())
}

/// A variable of process `pid`'s environment (readable for a process of the same user).
fn environ_var(pid: u32, name: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = std::str::from_utf8(kv).ok()?;
        kv.strip_prefix(name)?.strip_prefix('=').map(String::from)
    })
}

impl GpuProbe {
    pub fn open() -> GpuProbe {
        Self::open_for(None)
    }

    /// The GPUs as process `watched` sees them (an attached viewer: its CUDA_VISIBLE_DEVICES and
    /// its memory on each device), or as this process does for None.
    pub fn open_for(watched: Option<u32>) -> GpuProbe {
        let init = if crate::fault::is("no_nvml") {
            Nvml::builder()
                .lib_path(std::ffi::OsStr::new("/nonexistent/libnvidia-ml.so.1"))
                .init()
        } else {
            Nvml::init()
        };
        let nvml = match init {
            Ok(nvml) => nvml,
            Err(e) => return GpuProbe::Absent(format!("no NVIDIA GPU (NVML not found: {e})")),
        };
        let ids = match device_ids(&nvml) {
            Ok(ids) => ids,
            Err(e) => return GpuProbe::Absent(format!("no NVIDIA GPU ({e})")),
        };
        // The CUDA runtime's own bus ids are exact; the environment is the fallback (a viewer
        // process without CUDA, a build without the shim).
        let cuda = match watched {
            Some(pid) => cuda_to_nvml(environ_var(pid, "CUDA_VISIBLE_DEVICES").as_deref(), &ids),
            None => match runtime_bus_ids().and_then(|b| super::visible::by_bus_id(&b, &ids)) {
                Some(cuda) => cuda,
                None => {
                    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
                    cuda_to_nvml(visible.as_deref(), &ids)
                }
            },
        };
        GpuProbe::Present(Box::new(Gpus {
            nvml,
            cuda_of: nvml_to_cuda(&cuda, ids.len()),
            pid: watched.unwrap_or_else(std::process::id),
        }))
    }

    /// Reads every device; a field a device does not report reads 0 (or None).
    pub fn sample(&self) -> Result<Vec<GpuSample>, String> {
        let gpus = match self {
            GpuProbe::Present(g) => g,
            GpuProbe::Absent(why) => return Err(why.clone()),
        };
        let count = gpus
            .nvml
            .device_count()
            .map_err(|e| format!("NVML device count: {e}"))?;
        (0..count)
            .map(|index| {
                let dev = gpus
                    .nvml
                    .device_by_index(index)
                    .map_err(|e| format!("NVML device {index}: {e}"))?;
                let mut s = read_device(&dev, gpus.pid);
                s.index = index;
                s.cuda = gpus.cuda_of.get(index as usize).copied().flatten();
                Ok(s)
            })
            .collect()
    }
}

fn read_device(dev: &Device, pid: u32) -> GpuSample {
    let mem = dev.memory_info().ok();
    let util = dev.utilization_rates().ok();
    GpuSample {
        name: dev.name().unwrap_or_else(|_| "?".into()),
        util_pct: util.as_ref().map(|u| u.gpu).unwrap_or(0),
        mem_bw_pct: util.as_ref().map(|u| u.memory).unwrap_or(0),
        mem_used_mib: mem.as_ref().map(|m| m.used >> 20).unwrap_or(0),
        mem_total_mib: mem.as_ref().map(|m| m.total >> 20).unwrap_or(0),
        proc_mem_mib: process_memory(dev, pid),
        power_w: dev.power_usage().map(|p| p as f64 / 1000.0).unwrap_or(0.0),
        sm_clock_mhz: dev.clock_info(Clock::SM).unwrap_or(0),
        temp_c: dev.temperature(TemperatureSensor::Gpu).unwrap_or(0),
        throttle: dev
            .current_throttle_reasons()
            .map(|r| throttle_names(r).into_iter().map(String::from).collect())
            .unwrap_or_default(),
        ..GpuSample::default()
    }
}

/// MiB this pid holds on the device, from NVML's running compute processes.
fn process_memory(dev: &Device, pid: u32) -> Option<u64> {
    let procs = dev.running_compute_processes().ok()?;
    let mut ours = procs.iter().filter(|p| p.pid == pid).peekable();
    ours.peek()?;
    Some(
        ours.map(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => b >> 20,
            UsedGpuMemory::Unavailable => 0,
        })
        .sum(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watched_process_environment_is_read() {
        let pid = std::process::id();
        assert!(environ_var(pid, "PATH").is_some_and(|p| !p.is_empty()));
        assert_eq!(environ_var(pid, "DFLASH_TOP_NO_SUCH_VARIABLE"), None);
    }

    #[test]
    fn throttle_reasons_have_short_names_in_a_fixed_order() {
        let r = ThrottleReasons::HW_THERMAL_SLOWDOWN | ThrottleReasons::SW_POWER_CAP;
        assert_eq!(throttle_names(r), vec!["sw-power", "hw-thermal"]);
        assert_eq!(throttle_names(ThrottleReasons::GPU_IDLE), vec!["idle"]);
        assert!(throttle_names(ThrottleReasons::NONE).is_empty());
        assert_eq!(throttle_names(ThrottleReasons::all()).len(), 9);
    }

    #[test]
    fn without_nvml_the_probe_says_so_in_one_line() {
        // On a host with a GPU this takes the real path; both must give a usable answer.
        match GpuProbe::open() {
            GpuProbe::Absent(why) => {
                assert!(why.starts_with("no NVIDIA GPU"), "{why}");
                assert!(!why.contains('\n'), "{why}");
            }
            GpuProbe::Present(_) => {}
        }
    }
}
