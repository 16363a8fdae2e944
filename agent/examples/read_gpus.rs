//! What `berth agent` reads on this node, printed instead of sent: the report (JSON) and
//! the telemetry readings it carries, `--samples` times a second apart. For checking a
//! node's NVML by hand, and the agent's readings against `nvidia-smi`.
//!
//! `cargo run -p berth-agent --example read_gpus -- 3`
#![allow(clippy::print_stdout)] // printing is what it is for

fn main() {
    let samples: u32 = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(1);
    let (probe, why_none) = berth_agent::open_probe();
    if let Some(why) = why_none {
        println!("{why}");
    }
    for n in 0..samples {
        if n > 0 {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        match berth_agent::node_report(probe.as_ref()) {
            Ok(report) => {
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
                for r in report.readings("this-node", 0) {
                    println!(
                        "reading gpu {}: {:.0}% busy, {:.0} of {:.0} MiB, {:?} W, {:?} °C",
                        r.gpu_index,
                        r.utilization_pct,
                        r.memory_used_mib,
                        r.memory_total_mib,
                        r.power_w,
                        r.temperature_c
                    );
                }
            }
            Err(e) => println!("cannot read the GPUs: {e}"),
        }
    }
}
