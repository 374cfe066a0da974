//! `peerless bench`'s library (`tools::xla_bench`) on XLA's CPU plugin: 4 devices, two
//! small sizes, f32 and bf16, every op, Peerless's pass applied and XLA's own collectives,
//! 2 samples × 2 executes. Every row must pass its check, every Peerless row must have run
//! its collective on a Peerless custom call (the pass's decisions), and the CSV must have
//! the documented columns.
//!
//! Needs XLA's CPU plugin (as tests/xla_run.rs): without it the test fails unless
//! PEERLESS_SKIP_XLA_PLUGIN=1. `auto`'s verdicts are checked on made-up rows, without it.

use std::path::PathBuf;

use tools::xla_bench::{CSV_HEADER, Check, Dtype, Impl, Op, Options, Report, Row, run};

#[test]
fn bench_on_the_cpu_plugin() {
    let plugin = match tools::xla_run::find_plugin(None) {
        Ok(p) => p,
        Err(e) if std::env::var("PEERLESS_SKIP_XLA_PLUGIN").as_deref() == Ok("1") => {
            eprintln!("SKIPPED (PEERLESS_SKIP_XLA_PLUGIN=1): {e}");
            return;
        }
        Err(e) => panic!("{e}\n(set PEERLESS_SKIP_XLA_PLUGIN=1 to skip this test)"),
    };
    let opts = Options {
        plugin: Some(plugin),
        devices: Some(4),
        min_bytes: 256,
        max_bytes: 4096,
        step: 16,
        samples: 2,
        iters: 2,
        chain: 2,
        ops: Op::ALL.to_vec(),
        dtypes: vec![Dtype::F32, Dtype::Bf16],
        impls: vec![Impl::Peerless, Impl::Xla],
        flags: String::new(),
        sample_ms: None,
        close_calls: None,
        sizes: None,
    };
    let report = run(&opts, &mut |line| eprintln!("{line}")).expect("bench runs");
    assert_eq!(report.devices, 4);
    // 5 ops × 2 dtypes × 2 sizes × 2 impls.
    assert_eq!(report.rows.len(), 40, "{:#?}", report.rows);
    for r in &report.rows {
        let what = format!("{} {} {} B {}", r.op.name(), r.dtype.name(), r.bytes, r.imp.name());
        assert_eq!(r.check, Check::Same, "{what}");
        assert!(r.us.is_some_and(|us| us > 0.0), "{what}: {:?}", r.us);
        match r.imp {
            Impl::Peerless => {
                assert_eq!(r.decisions.len(), opts.chain, "{what}: {:?}", r.decisions);
                assert_eq!(r.peerless_calls(), opts.chain, "{what}: {:?}", r.decisions);
                assert!(r.path.starts_with("kernel"), "{what}: {}", r.path);
            }
            _ => assert_eq!(r.peerless_calls(), 0, "{what}"),
        }
    }
    let csv = report.csv();
    let mut lines = csv.lines();
    let header = lines.next().expect("a header");
    assert_eq!(header, CSV_HEADER);
    let columns: Vec<&str> = header.split(',').collect();
    for c in ["op", "dtype", "devices", "bytes", "impl", "chain", "path", "peerless_calls", "us_per_collective"] {
        assert!(columns.contains(&c), "no column {c} in {header}");
    }
    for c in ["algbw_gbps", "busbw_gbps", "check"] {
        assert!(columns.contains(&c), "no column {c} in {header}");
    }
    assert_eq!(lines.clone().count(), report.rows.len());
    let check_col = columns.iter().position(|&c| c == "check").expect("check column");
    for l in lines {
        // No field of these rows is quoted (paths without commas): a plain split works.
        let f: Vec<&str> = l.split(',').collect();
        assert_eq!(f.len(), columns.len(), "{l}");
        assert_eq!(f[check_col], "same", "{l}");
    }
}

/// Two rows that compile the same program are timed once, as the first: `peerless` twice (as
/// `auto` is when it chooses what `peerless` forces) gives one time and says so; XLA's row is
/// another program.
#[test]
fn a_program_compiled_twice_is_timed_once() {
    let Ok(plugin) = tools::xla_run::find_plugin(None) else {
        assert_eq!(std::env::var("PEERLESS_SKIP_XLA_PLUGIN").as_deref(), Ok("1"), "no XLA CPU plugin");
        return;
    };
    let opts = Options {
        plugin: Some(plugin),
        devices: Some(4),
        min_bytes: 1024,
        max_bytes: 1024,
        step: 4,
        samples: 3,
        iters: 2,
        chain: 2,
        ops: vec![Op::AllReduce],
        dtypes: vec![Dtype::F32],
        impls: vec![Impl::Peerless, Impl::Xla, Impl::Peerless],
        flags: String::new(),
        sample_ms: None,
        close_calls: None,
        sizes: None,
    };
    let report = run(&opts, &mut |line| eprintln!("{line}")).expect("bench runs");
    let r = &report.rows;
    assert_eq!(r.len(), 3, "{r:#?}");
    assert!(r.iter().all(|x| x.check == Check::Same && x.us.is_some()), "{r:#?}");
    assert_eq!(r[2].us, r[0].us);
    assert!(r[2].path.ends_with("[the program of the peerless row, timed once]"), "{}", r[2].path);
    assert!(!r[0].path.contains("timed once") && !r[1].path.contains("timed once"), "{r:#?}");
}

/// `peerless tune --quick`'s library on the CPU plugin (8 devices): every row checked, a
/// profile written with XLA's and each kernel's figures, and the pass reading it back: a
/// decision's reason names the profile file and its figures.
#[test]
fn a_short_tune_writes_a_profile_the_pass_reads() {
    use emitter::tuning::{Profile, ProfileSource, XLA};
    use tools::xla_tune::{TuneOptions, run as tune};
    let plugin = match tools::xla_run::find_plugin(None) {
        Ok(p) => p,
        Err(e) if std::env::var("PEERLESS_SKIP_XLA_PLUGIN").as_deref() == Ok("1") => {
            eprintln!("SKIPPED (PEERLESS_SKIP_XLA_PLUGIN=1): {e}");
            return;
        }
        Err(e) => panic!("{e}\n(set PEERLESS_SKIP_XLA_PLUGIN=1 to skip this test)"),
    };
    let dir = std::env::temp_dir().join(format!("peerless-tune-test-{}", std::process::id()));
    let mut opts = TuneOptions {
        out_dir: Some(dir.clone()),
        command: "test".into(),
        machine: "test".into(),
        ..TuneOptions::default().quick()
    };
    (opts.bench.plugin, opts.bench.devices) = (Some(plugin), Some(8));
    let report = tune(&opts, &mut |line| eprintln!("{line}")).expect("tune runs");
    assert!(report.rows.iter().all(|r| !matches!(r.check, Check::Error(_))), "{:#?}", report.rows);
    assert_eq!(report.path, dir.join(report.profile.key.file_name()));
    let back = Profile::from_json(&std::fs::read_to_string(&report.path).unwrap(), "x").unwrap();
    assert_eq!(back.entries, report.profile.entries);
    // 5 kinds, f32, groups of 8; each measured size has XLA's time and the kernels'.
    assert_eq!(back.entries.len(), 5, "{:#?}", back.entries);
    for e in &back.entries {
        assert_eq!((e.dtype.as_str(), e.group), ("f32", 8), "{e:?}");
        for p in &e.points {
            let want = if e.op == "all-reduce" { 3 } else { 2 };
            assert!(p.us.contains_key(XLA) && p.us.len() == want, "{e:?}");
        }
    }
    // The pass reads it: every decision of a bench module cites the file and its figures.
    let ids: Vec<i64> = (0..8).collect();
    for op in Op::ALL {
        let module = tools::xla_bench::module(op, Dtype::F32, 2048, 8, 1);
        let source = ProfileSource::File(report.path.clone());
        let (_, outcome) =
            tools::xla_run::prepare_tuned(&module, runs::Mode::Replica, &ids, plugin::Platform::Cpu, &[], source)
                .unwrap();
        let cite = format!("profile {}: {}", report.path.display(), op.name());
        for d in &outcome.decisions {
            assert!(d.reason.contains(&cite) && d.reason.contains("µs"), "{op:?}: {}", d.reason);
        }
        // Flags win: a forced backend decides without it.
        let forced = [format!("--{}_backend=fallback", op.name().replace('-', "_"))];
        let source = ProfileSource::File(report.path.clone());
        let (_, outcome) =
            tools::xla_run::prepare_tuned(&module, runs::Mode::Replica, &ids, plugin::Platform::Cpu, &forced, source)
                .unwrap();
        assert!(outcome.decisions.iter().all(|d| d.reason.starts_with("forced by")), "{:?}", outcome.decisions);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The date a profile is stamped with (`tools::xla_tune::today`).
#[test]
fn today_is_a_date() {
    let d = tools::xla_tune::today();
    assert_eq!(d.len(), 10, "{d}");
    assert!(d.starts_with("20"), "{d}");
}

fn row(op: Op, bytes: usize, imp: Impl, us: Option<f64>) -> Row {
    Row {
        op,
        dtype: Dtype::F32,
        bytes,
        imp,
        path: format!("{} path", imp.name()),
        decisions: Vec::new(),
        us,
        algbw_gbps: None,
        busbw_gbps: None,
        check: if us.is_some() { Check::Same } else { Check::Skipped("not timed".into()) },
    }
}

#[test]
fn auto_is_judged_against_the_fastest_it_chooses_among() {
    let rows = vec![
        row(Op::AllReduce, 1024, Impl::Peerless, Some(10.0)),
        row(Op::AllReduce, 1024, Impl::Auto, Some(10.5)),
        row(Op::AllReduce, 1024, Impl::TwoShot, Some(9.0)),
        row(Op::AllReduce, 1024, Impl::Xla, Some(12.0)),
        // XLA's collective kernels are no choice of the pass's: never the yardstick.
        row(Op::AllReduce, 1024, Impl::XlaKernels, Some(1.0)),
        row(Op::AllGather, 1024, Impl::Auto, Some(30.0)),
        row(Op::AllGather, 1024, Impl::Xla, Some(20.0)),
        // No timed auto row: no verdict.
        row(Op::AllGather, 4096, Impl::Auto, None),
        row(Op::AllGather, 4096, Impl::Xla, Some(20.0)),
    ];
    let report = Report {
        plugin: PathBuf::new(),
        platform: plugin::Platform::Cpu,
        device_kind: "cpu".into(),
        devices: 8,
        chain: 8,
        samples: 1,
        iters: 1,
        rows,
    };
    let v = report.auto_verdicts();
    assert_eq!(v.len(), 2, "{v:#?}");
    assert_eq!((v[0].op, v[0].best), (Op::AllReduce, Impl::TwoShot));
    assert!((v[0].ratio() - 10.5 / 9.0).abs() < 1e-12);
    assert_eq!((v[1].op, v[1].best), (Op::AllGather, Impl::Xla));
    assert!((v[1].ratio() - 1.5).abs() < 1e-12);
}
