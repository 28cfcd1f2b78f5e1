//! Prometheus text metrics on a loopback address (`GET /metrics`), built from a status
//! snapshot per scrape with the `prometheus-client` encoder, served by `tiny_http`.

use crate::server::Shared;
use attune_proto::Status;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

type Labels = Vec<(String, String)>;
type F64Gauge = Gauge<f64, AtomicU64>;

/// A label value as the text exposition format needs it: backslash, `"` and line feed escaped.
/// `prometheus-client` writes label values as given (client_rust issue #151), and a
/// workflow name is the user's: unescaped, `w"} 1\nattune_x{uid="0` forges a series.
fn label(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

/// The exposition text of one status snapshot.
pub fn render(s: &Status) -> String {
    let mut reg = Registry::with_prefix("attune");
    let node = |reg: &mut Registry, name: &str, help: &str, v: f64| {
        let g = F64Gauge::default();
        g.set(v);
        reg.register(name, help, g);
    };
    node(
        &mut reg,
        "dram_pool_bytes",
        "DRAM the daemon divides among workflows and shared regions",
        s.dram_pool as f64,
    );
    node(
        &mut reg,
        "granted_bytes",
        "DRAM granted to workflows, summed",
        s.granted as f64,
    );
    node(
        &mut reg,
        "far_pool_bytes",
        "Node memory divided among the runtimes' memory far tiers (0: not divided)",
        s.far_pool as f64,
    );
    node(
        &mut reg,
        "far_granted_bytes",
        "Far memory granted to workflows, summed",
        s.far_granted as f64,
    );
    node(
        &mut reg,
        "pool_bytes",
        "Far pool memory allocated in this daemon for the runtimes' pool tiers (charged to its cgroup)",
        s.pool_bytes as f64,
    );
    node(
        &mut reg,
        "shared_bytes",
        "Bytes held by shared regions",
        s.shared_bytes as f64,
    );
    node(
        &mut reg,
        "requests",
        "Requests served since start",
        s.requests as f64,
    );
    node(
        &mut reg,
        "rejected",
        "Malformed, refused or unauthorized requests since start",
        s.rejected as f64,
    );
    node(
        &mut reg,
        "rebalances",
        "Budget recomputations since start",
        s.rebalances as f64,
    );
    node(
        &mut reg,
        "grants_pushed",
        "Grants sent to runtimes by rebalances since start",
        s.grants_pushed as f64,
    );
    node(
        &mut reg,
        "workflows",
        "Registered workflows",
        s.workflows.len() as f64,
    );
    if let Some(ms) = s.last_reclaim_ms {
        node(
            &mut reg,
            "last_reclaim_seconds",
            "Time for shrunk workflows to give DRAM back, last time",
            ms / 1e3,
        );
    }
    let per_wf: [(&str, &str, fn(&attune_proto::WorkflowStatus) -> f64); 10] = [
        (
            "workflow_far_bytes",
            "Bytes in the workflow's memory far tiers",
            |w| w.far_used as f64,
        ),
        (
            "workflow_far_grant_bytes",
            "Far memory granted to the workflow",
            |w| w.far_grant as f64,
        ),
        (
            "workflow_pool_bytes",
            "Far pool memory allocated in the daemon for the workflow's pool segments",
            |w| w.pool as f64,
        ),
        (
            "workflow_grant_bytes",
            "DRAM budget granted to the workflow",
            |w| w.grant as f64,
        ),
        (
            "workflow_want_bytes",
            "DRAM the workflow would use alone",
            |w| w.want as f64,
        ),
        (
            "workflow_resident_bytes",
            "Managed bytes resident in DRAM",
            |w| w.resident as f64,
        ),
        ("workflow_pinned_bytes", "Pinned (LAT/SHL) bytes", |w| {
            w.pinned as f64
        }),
        ("workflow_faults", "Faults served by the runtime", |w| {
            w.faults as f64
        }),
        ("workflow_evictions", "Chunks moved out of DRAM", |w| {
            w.evictions as f64
        }),
        ("workflow_processes", "Processes registered", |w| {
            w.processes.max(w.pids.len() as u64) as f64
        }),
    ];
    for (name, help, f) in per_wf {
        let fam = Family::<Labels, F64Gauge>::default();
        for w in &s.workflows {
            let l = vec![
                ("workflow".into(), label(&w.name)),
                ("uid".into(), w.uid.to_string()),
                ("job".into(), label(&w.job)),
                ("flags".into(), label(&w.flags)),
            ];
            fam.get_or_create(&l).set(f(w));
        }
        reg.register(name, help, fam);
    }
    let fam = Family::<Labels, F64Gauge>::default();
    let refs = Family::<Labels, F64Gauge>::default();
    for r in &s.shared {
        let l = vec![
            ("region".into(), label(&r.name)),
            ("owner".into(), r.owner.to_string()),
        ];
        fam.get_or_create(&l).set(r.resident as f64);
        refs.get_or_create(&l).set(r.refs as f64);
    }
    reg.register(
        "shared_region_resident_bytes",
        "Resident bytes of a shared region",
        fam,
    );
    reg.register("shared_region_refs", "References to a shared region", refs);
    // One series per feature the runtimes may use, 1 where this node's kernel lacks or
    // refuses it (the runtimes run its fallback): a fleet's dashboards find the nodes
    // that run slower paths without parsing `attune status`.
    let features = Family::<Labels, F64Gauge>::default();
    for f in attune_sys::kernel::FEATURES {
        let missing = s.kernel_fallbacks.iter().any(|m| m == f.name);
        features
            .get_or_create(&vec![("feature".into(), f.name.to_string())])
            .set(if missing { 1.0 } else { 0.0 });
    }
    reg.register(
        "kernel_feature_fallback",
        "1 when the kernel lacks or refuses this feature and the runtimes run its fallback (docs/design/kernels.md)",
        features,
    );
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    out
}

/// Serves `/metrics` until the process ends.
pub fn serve(addr: &str, state: Shared) -> Result<(), String> {
    let server = tiny_http::Server::http(addr).map_err(|e| format!("metrics on {addr}: {e}"))?;
    std::thread::Builder::new()
        .name("attuned-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let resp = if req.url() == "/metrics" {
                    let st = state.lock().unwrap_or_else(|p| p.into_inner()).status();
                    let h =
                        tiny_http::Header::from_bytes("Content-Type", "text/plain; version=0.0.4")
                            .unwrap();
                    tiny_http::Response::from_string(render(&st)).with_header(h)
                } else {
                    tiny_http::Response::from_string("see /metrics\n").with_status_code(404)
                };
                let _ = req.respond(resp);
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_workflows_and_regions() {
        let s = Status {
            dram_pool: 1 << 30,
            workflows: vec![attune_proto::WorkflowStatus {
                name: "lat-job".into(),
                uid: 1000,
                job: "42".into(),
                flags: "LAT".into(),
                grant: 4096,
                pids: vec![7],
                ..Default::default()
            }],
            shared: vec![attune_proto::SharedStatus {
                name: "input".into(),
                owner: 1000,
                refs: 2,
                resident: 8192,
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = render(&s);
        assert!(t.contains("attune_dram_pool_bytes 1073741824"), "{t}");
        assert!(
            t.contains(
                "attune_workflow_grant_bytes{workflow=\"lat-job\",uid=\"1000\",job=\"42\",flags=\"LAT\"} 4096"
            ),
            "{t}"
        );
        assert!(
            t.contains("attune_shared_region_refs{region=\"input\",owner=\"1000\"} 2"),
            "{t}"
        );
        assert!(t.ends_with("# EOF\n"));
    }

    #[test]
    fn every_kernel_feature_has_a_series_and_the_missing_read_one() {
        let s = Status {
            kernel_fallbacks: vec!["move".into(), "pagemap_scan".into()],
            ..Default::default()
        };
        let t = render(&s);
        for f in attune_sys::kernel::FEATURES {
            let want = if f.name == "move" || f.name == "pagemap_scan" {
                1
            } else {
                0
            };
            let line = format!(
                "attune_kernel_feature_fallback{{feature=\"{}\"}} {want}",
                f.name
            );
            assert!(t.contains(&line), "{line} in {t}");
        }
    }

    #[test]
    fn a_workflow_name_cannot_forge_a_series() {
        let evil = r#"x",uid="0"} 1
attune_workflow_grant_bytes{workflow="y\"#;
        let s = Status {
            workflows: vec![attune_proto::WorkflowStatus {
                name: evil.into(),
                uid: 1000,
                flags: "CAP".into(),
                grant: 7,
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = render(&s);
        let series: Vec<&str> = t
            .lines()
            .filter(|l| l.starts_with("attune_workflow_grant_bytes"))
            .collect();
        assert_eq!(series.len(), 1, "{t}");
        assert_eq!(
            series[0],
            r#"attune_workflow_grant_bytes{workflow="x\",uid=\"0\"} 1\nattune_workflow_grant_bytes{workflow=\"y\\",uid="1000",job="",flags="CAP"} 7.0"#
        );
        assert_eq!(label(r#"a\b"c"#), r#"a\\b\"c"#);
    }

    #[test]
    fn a_claim_is_bounded_by_the_tightest_memory_limit_on_the_cgroup_path() {
        use crate::server::memory_limit;
        let files = |pairs: &'static [(&'static str, &'static str)]| {
            move |p: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == p)
                    .map(|(_, v)| v.to_string())
            }
        };
        let v1 = "12:memory:/slurm_n/uid_1/job_7/step_0/task_0\n4:cpu,cpuacct:/\n";
        let m = "/sys/fs/cgroup/memory";
        // The job's limit is the tightest; "unlimited" (page-rounded i64::MAX) is none.
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/slurm_n/uid_1/job_7/step_0/task_0/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/slurm_n/uid_1/job_7/step_0/memory.limit_in_bytes",
                "209715200\n",
            ),
            (
                "/sys/fs/cgroup/memory/slurm_n/uid_1/job_7/memory.limit_in_bytes",
                "104857600\n",
            ),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        assert_eq!(memory_limit(v1, &read), 100 << 20, "{m}");
        let v2 = "0::/system.slice/slurmstepd.scope/job_7/step_0\n";
        let read = files(&[
            (
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_0/memory.max",
                "max\n",
            ),
            (
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/memory.max",
                "52428800\n",
            ),
        ]);
        assert_eq!(memory_limit(v2, &read), 50 << 20);
        // No controller, no files, garbage: no limit.
        let none = files(&[]);
        for c in ["", "0::/\n", "3:cpu:/x\n", "garbage"] {
            assert_eq!(memory_limit(c, &none), u64::MAX, "{c:?}");
        }
    }

    #[test]
    fn the_job_label_comes_from_slurms_cgroup_not_the_workflow_name() {
        use crate::server::slurm_job;
        let v1 = "12:memory:/slurm_localhost/uid_65534/job_17/step_0/task_0\n3:cpu:/\n";
        assert_eq!(slurm_job(v1), "17");
        let v2 = "0::/system.slice/slurmstepd.scope/job_4242/step_batch/user/task_0\n";
        assert_eq!(slurm_job(v2), "4242");
        for none in [
            "",
            "0::/user.slice/user-1000.slice\n",
            "5:memory:/job_x/job_/\n",
            "garbage",
        ] {
            assert_eq!(slurm_job(none), "", "{none:?}");
        }
    }
}
