//! The process metrics every Prometheus client library exports, read from
//! `/proc/self` at each scrape (Linux; elsewhere they are left out):
//! `process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`. Names and meanings are those of the
//! Prometheus client libraries' process collectors, so stock dashboards and
//! alerts work unchanged.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Unit,
};

/// Clock ticks per second of `/proc/<pid>/stat` times: USER_HZ, which Linux
/// fixes at 100 for every architecture's user-space ABI.
const TICKS_PER_SECOND: f64 = 100.0;

/// The collector, registered once on the unprefixed registry.
#[derive(Debug)]
pub(crate) struct ProcessCollector;

/// One reading of `/proc/self`.
#[derive(Debug, Default, PartialEq)]
struct Reading {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    start_time_seconds: f64,
    open_fds: f64,
    max_fds: f64,
}

impl Reading {
    fn now() -> Option<Reading> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let boot_time = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("Max open files")?.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        let mut reading = Reading::parse(&stat, &status, boot_time)?;
        reading.open_fds = open_fds;
        reading.max_fds = max_fds;
        Some(reading)
    }

    /// `stat` and `status` as the kernel writes them, `boot_time` in unix seconds.
    fn parse(stat: &str, status: &str, boot_time: f64) -> Option<Reading> {
        // The command name is in parentheses and may hold spaces: count fields after it.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // After the name: state is field 3 of the stat line, so field n is fields[n - 3].
        let number = |n: usize| fields.get(n - 3)?.parse::<f64>().ok();
        // In kB whatever the page size.
        let resident_kb =
            status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse::<f64>().ok())?;
        Some(Reading {
            cpu_seconds: (number(14)? + number(15)?) / TICKS_PER_SECOND,
            virtual_bytes: number(23)?,
            resident_bytes: resident_kb * 1024.0,
            start_time_seconds: boot_time + number(22)? / TICKS_PER_SECOND,
            ..Reading::default()
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(r) = Reading::now() else { return Ok(()) };
        let cpu = ConstCounter::new(r.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu",
            "Total user and system CPU time spent",
            Some(&Unit::Seconds),
            cpu.metric_type(),
        )?)?;
        let gauges = [
            ("process_resident_memory", "Resident memory size", Some(Unit::Bytes), r.resident_bytes),
            ("process_virtual_memory", "Virtual memory size", Some(Unit::Bytes), r.virtual_bytes),
            (
                "process_start_time",
                "Start time of the process since the unix epoch",
                Some(Unit::Seconds),
                r.start_time_seconds,
            ),
            ("process_open_fds", "Open file descriptors", None, r.open_fds),
            ("process_max_fds", "The most open file descriptors allowed", None, r.max_fds),
        ];
        for (name, help, unit, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, unit.as_ref(), gauge.metric_type())?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_stat_lines_even_with_spaces_in_the_name() {
        let stat = "4242 (echomq side car) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 3000 123456789 2000 18446744073709551615 1 1 0 0 0 0 0 4096 0 0 0 0 17 1 0 0 0 0 0";
        let status = "Name:\techomq side car\nVmPeak:\t  9000 kB\nVmRSS:\t    8000 kB\nThreads:\t9\n";
        let reading = Reading::parse(stat, status, 1_700_000_000.0).unwrap();
        assert_eq!(reading.cpu_seconds, 3.0);
        assert_eq!(reading.virtual_bytes, 123_456_789.0);
        assert_eq!(reading.resident_bytes, 8000.0 * 1024.0);
        assert_eq!(reading.start_time_seconds, 1_700_000_030.0);
    }

    #[test]
    fn this_process_can_be_read() {
        let reading = Reading::now().expect("/proc/self");
        assert!(reading.resident_bytes > 0.0 && reading.open_fds >= 3.0 && reading.max_fds > 0.0, "{reading:?}");
    }
}
