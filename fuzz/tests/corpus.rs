//! Replays every saved fuzz input (`fuzz/corpus/<target>/*`, the minimised corpora the
//! libFuzzer runs produced, seeds included) through the same target functions the fuzzer
//! runs, on stable Rust. A panic here is a regression of a parser's robustness.

use std::path::PathBuf;

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus").join(target)
}

#[test]
fn every_saved_input_replays_without_panicking() {
    let mut total = 0;
    for &(name, run) in fuzz_targets::TARGETS {
        let dir = corpus_dir(name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("directory entry").path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(files.len() >= 5, "{name}: only {} saved inputs in {}", files.len(), dir.display());
        for f in &files {
            let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            let started = std::time::Instant::now();
            run(&data);
            let took = started.elapsed();
            assert!(took.as_secs() < 20, "{name}: {} took {took:?}", f.display());
        }
        eprintln!("{name}: {} inputs replayed", files.len());
        total += files.len();
    }
    assert!(total > 0);
}
