//! Replays the committed config fuzz corpus through the fuzz target's own
//! check on the stable toolchain (see splitway-proto's `fuzz_corpus` test).

use std::path::Path;

#[path = "../../../fuzz/checks/config.rs"]
mod config;

#[test]
fn config_corpus() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/config");
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("corpus entry").path();
        let data = std::fs::read(&path).expect("corpus file");
        if std::panic::catch_unwind(|| config::check(&data)).is_err() {
            panic!("config: {} fails its check", path.display());
        }
        replayed += 1;
    }
    assert!(replayed > 0, "{}: empty corpus", dir.display());
}
