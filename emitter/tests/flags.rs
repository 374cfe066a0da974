//! `emitter::flags`: the backend flags parse, round-trip, and name every valid flag in errors.

use emitter::flags::{Backend, CopyEngines, FLAGS, Flags, HostTopology};

#[test]
fn defaults_come_from_one_place() {
    let f = Flags::parse("").unwrap();
    assert_eq!(f, Flags::default());
    assert_eq!(f.one_shot_max_bytes, 262_144);
    assert_eq!(f.two_shot_max_bytes, 4_194_304);
    assert_eq!(f.collective_timeout_ms, 10_000);
    assert_eq!(f.host_topology, HostTopology::FullMesh);
    let defaults: Vec<(&str, String)> = FLAGS.iter().map(|s| (s.name, s.default_value())).collect();
    assert!(defaults.contains(&("all_reduce_backend", "auto".into())));
    assert!(defaults.contains(&("one_shot_max_bytes", "262144".into())));
    assert!(defaults.contains(&("host_topology", "full".into())));
    let mut seen = std::collections::HashSet::new();
    assert!(FLAGS.iter().all(|s| seen.insert(s.name)));
}

#[test]
fn parses_every_flag_and_round_trips() {
    let s = "--all_reduce_backend=kernel --all_gather_backend=fallback --all_to_all_backend=auto \
             --reduce_scatter_backend=fallback --collective_permute_backend=kernel --one_shot_max_bytes=1024 \
             --two_shot_max_bytes=65536 --collective_timeout_ms=500 --host_topology=pairs:0-1,2-3 \
             --allow_unsafe_peer_targets=true --xla_async_above_bytes=none --overlap_above_bytes=1048576 \
             --async_blocks=8 --fuse_norm=false --copy_engines=65536";
    let f = Flags::parse(s).unwrap();
    assert_eq!((f.fuse_norm, Flags::default().fuse_norm), (Some(false), None));
    // The old grid flag (it never reached a launch; `async_blocks` does) is a clear error, not ignored.
    assert!(Flags::parse("--collective_blocks=64").unwrap_err().to_string().contains("unknown flag"));
    assert_eq!(f.all_reduce_backend, Backend::Kernel);
    assert_eq!(f.all_gather_backend, Backend::Fallback);
    assert_eq!(f.collective_permute_backend, Backend::Kernel);
    assert_eq!(f.one_shot_max_bytes, 1024);
    assert_eq!(f.two_shot_max_bytes, 65536);
    assert_eq!(f.collective_timeout_ms, 500);
    assert_eq!(f.host_topology, HostTopology::Pairs(vec![(0, 1), (2, 3)]));
    assert!(f.allow_unsafe_peer_targets && !Flags::default().allow_unsafe_peer_targets);
    assert_eq!((f.xla_async_above_bytes, Flags::default().xla_async_above_bytes), (None, Some(262_144)));
    assert_eq!((f.overlap_above_bytes, Flags::default().overlap_above_bytes), (Some(1 << 20), None));
    assert_eq!((f.async_blocks, Flags::default().async_blocks), (8, 32));
    // A block count the kernels' signal arrays cannot take is refused, not clamped.
    for bad in ["0", "129", "x"] {
        assert!(Flags::parse(&format!("--async_blocks={bad}")).is_err(), "{bad}");
    }
    assert_eq!((f.copy_engines, Flags::default().copy_engines), (CopyEngines::From(65536), CopyEngines::Off));
    assert_eq!(Flags::parse("--copy_engines=auto").unwrap().copy_engines, CopyEngines::Auto);
    assert_eq!(Flags::parse("--copy_engines=none").unwrap().copy_engines, CopyEngines::Off);
    assert!(Flags::parse("--copy_engines=fast").is_err());
    assert_eq!(f.to_string(), s.split_whitespace().collect::<Vec<_>>().join(" "));
    assert_eq!(Flags::parse(&f.to_string()).unwrap(), f);
    let mut g = Flags::default();
    g.apply("--host_topology=pairs:").unwrap();
    assert_eq!(g.host_topology, HostTopology::Pairs(vec![]));
    g.apply("--host_topology=full").unwrap();
    assert_eq!(g.host_topology, HostTopology::FullMesh);
}

#[test]
fn errors_list_every_valid_flag() {
    for (bad, want) in [
        ("--bogus=1", "unknown flag '--bogus'"),
        ("--all_reduce_backend=nccl", "bad value for --all_reduce_backend (auto|kernel|fallback)"),
        ("--one_shot_max_bytes=-1", "not a byte count"),
        ("--one_shot_max_bytes=256K", "not a byte count"),
        ("--collective_timeout_ms=0", "positive number of milliseconds"),
        ("--host_topology=ring", "neither 'full'"),
        ("--host_topology=pairs:0-0", "'0-0'"),
        ("--host_topology=pairs:0-x", "'0-x'"),
        ("--allow_unsafe_peer_targets=yes", "neither true nor false"),
        ("--all_reduce_backend", "has no value"),
        ("all_reduce_backend=kernel", "not a flag of the form"),
    ] {
        let e = Flags::parse(bad).unwrap_err().to_string();
        assert!(e.contains(want), "{bad}: {e}");
        for spec in FLAGS {
            assert!(e.contains(&format!("--{}={}", spec.name, spec.ty)), "{bad}: {e}");
        }
        assert!(e.contains("(default 262144)") && e.contains("(default auto)"), "{e}");
    }
}
