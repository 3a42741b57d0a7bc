//! GPUs through NVML (nvml-wrapper). Absent NVML is a normal state: the probe says so.

use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
use nvml_wrapper::Nvml;

#[derive(Clone, Debug, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    pub name: String,
    pub util_pct: u32,
    pub mem_used_mib: u64,
    pub mem_total_mib: u64,
    pub power_w: f64,
    pub sm_clock_mhz: u32,
    pub temp_c: u32,
}

pub enum GpuProbe {
    Present(Box<Nvml>),
    Absent(String),
}

impl GpuProbe {
    pub fn open() -> GpuProbe {
        match Nvml::init() {
            Ok(nvml) => GpuProbe::Present(Box::new(nvml)),
            Err(e) => GpuProbe::Absent(format!("no NVIDIA GPU (NVML not found: {e})")),
        }
    }

    /// Reads every device; a field a device does not report reads 0.
    pub fn sample(&self) -> Result<Vec<GpuSample>, String> {
        let nvml = match self {
            GpuProbe::Present(n) => n,
            GpuProbe::Absent(why) => return Err(why.clone()),
        };
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML device count: {e}"))?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let dev = nvml
                .device_by_index(index)
                .map_err(|e| format!("NVML device {index}: {e}"))?;
            let mem = dev.memory_info().ok();
            out.push(GpuSample {
                index,
                name: dev.name().unwrap_or_else(|_| "?".into()),
                util_pct: dev.utilization_rates().map(|u| u.gpu).unwrap_or(0),
                mem_used_mib: mem.as_ref().map(|m| m.used >> 20).unwrap_or(0),
                mem_total_mib: mem.as_ref().map(|m| m.total >> 20).unwrap_or(0),
                power_w: dev.power_usage().map(|p| p as f64 / 1000.0).unwrap_or(0.0),
                sm_clock_mhz: dev.clock_info(Clock::SM).unwrap_or(0),
                temp_c: dev.temperature(TemperatureSensor::Gpu).unwrap_or(0),
            });
        }
        Ok(out)
    }
}
