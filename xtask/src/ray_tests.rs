//! `cargo xtask ray-tests --ray-source DIR [--against both|trainyard|ray] [--only NAME] [--out FILE]
//! [-- PYTEST ARGS]`: Ray Train v2's own tests, run against trainyard through an import shim
//! (`ray.train` → `trainyard.train`) and, for the yardstick, against Ray 2.60 itself
//! (`python/tests/ray_suite/run.py` does the running; this finds its Python and builds the
//! `trainyard` binary it drives).
//!
//! DIR is a folder outside the repository laid out as Ray's (`DIR/python/ray/train/v2/tests/
//! test_*.py`, ...), with single files of Ray's repository fetched by hand: Ray's files are
//! never copied into this repository, so this runs by hand, not in CI.

use std::path::PathBuf;
use std::process::Command;

/// What the suite and Ray's test files import besides Ray, Lightning and Transformers: the
/// module and the package that brings it. `test_local_mode` and `test_torch_transformers_train`
/// import Hugging Face Datasets, scikit-learn, LightGBM, XGBoost and TensorFlow (with its
/// legacy Keras, on Python 3.11) when the file is loaded, whichever test runs.
const TEST_IMPORTS: &[(&str, &str)] = &[
    ("pytest", "pytest"),
    ("cloudpickle", "cloudpickle"),
    ("datasets", "datasets"),
    ("sklearn", "scikit-learn"),
    ("lightgbm", "lightgbm"),
    ("xgboost", "xgboost-cpu"),
    ("tensorflow", "tensorflow-cpu"),
    ("tf_keras", "tf-keras"),
];

/// Runs the suite (see the module).
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    if !args.iter().any(|a| a == "--ray-source") {
        return Err("usage: cargo xtask ray-tests --ray-source DIR [--against both|trainyard|ray] [--only NAME] [--out FILE] [PYTEST ARGS]".to_owned());
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = root
        .canonicalize()
        .map_err(|e| format!("cannot find the workspace at {}: {e}", root.display()))?;
    // Ray 2.60 for the yardstick, Lightning and Transformers for their tests: one venv.
    let python = crate::bench_e2e::script_python(&root, "scripts/ray-env.sh")?;
    crate::bench_e2e::script_python(&root, "scripts/integrations-env.sh")?;
    let missing: Vec<&str> = TEST_IMPORTS
        .iter()
        .filter(|(module, _)| {
            !Command::new(&python)
                .args(["-c", &format!("import {module}")])
                .output()
                .is_ok_and(|out| out.status.success())
        })
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        crate::python::run(
            Command::new(&python)
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
                .args(&missing),
        )?;
    }
    crate::cargo(&["build", "-p", "trainyard-cli"])?;
    let binary = crate::target_dir().join("debug/trainyard");
    crate::python::run(
        Command::new(&python)
            .arg(root.join("python/tests/ray_suite/run.py"))
            .args(args)
            .env("TRAINYARD_BIN", binary),
    )
}
