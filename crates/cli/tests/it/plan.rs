//! `trainyard plan` through the built binary.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use assert_cmd::Command;
use serde_json::{Value, json};

fn trainyard() -> Command {
    let mut cmd = Command::cargo_bin("trainyard").expect("the trainyard binary is built");
    // A panic would print a backtrace; the bad-input tests check that none appears.
    cmd.env("RUST_BACKTRACE", "1");
    cmd
}

/// Runs `trainyard plan ARGS --format json`, expecting success, and returns the JSON.
fn plan_json(args: &[&str]) -> Value {
    let output = trainyard()
        .arg("plan")
        .args(args)
        .args(["--format", "json"])
        .output()
        .expect("trainyard runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "plan {args:?} failed: {stderr}");
    assert!(stderr.is_empty(), "plan {args:?} wrote to stderr: {stderr}");
    serde_json::from_slice(&output.stdout).expect("plan prints one JSON object")
}

fn bundles(plan: &Value) -> &Vec<Value> {
    plan["placement_group_factory"]["bundles"]
        .as_array()
        .expect("bundles is a list")
}

fn workers(plan: &Value) -> &Vec<Value> {
    plan["workers"].as_array().expect("workers is a list")
}

/// A directory of its own under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let dir =
            std::env::temp_dir().join(format!("trainyard-cli-test-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    fn file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).expect("temp file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn path_arg(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

#[test]
fn the_seed_example_gives_two_workers_with_memory_as_an_actor_option() {
    let plan = plan_json(&["-n", "2", "-r", r#"{"memory": 10000}"#]);
    let workers = workers(&plan);
    assert_eq!(workers.len(), 2);
    for (i, worker) in workers.iter().enumerate() {
        assert_eq!(
            worker,
            &json!({
                "bundle_index": i,
                "actor_options": {
                    "num_cpus": 0,
                    "num_gpus": 0,
                    "memory": 10000,
                    "object_store_memory": null,
                    "resources": {}
                }
            })
        );
    }
    assert_eq!(bundles(&plan), &vec![json!({"memory": 10000}); 2]);
    assert_eq!(plan["total_resources"], json!({"memory": 20000}));
}

#[test]
fn json_output_has_exactly_the_contract_keys() {
    let plan = plan_json(&["-n", "2", "-r", r#"{"memory": 10000}"#]);
    let keys: Vec<&str> = plan
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "placement_group_factory",
            "scaling_config",
            "total_resources",
            "workers"
        ]
    );
    let factory = plan["placement_group_factory"]
        .as_object()
        .expect("an object");
    let mut factory_keys: Vec<&str> = factory.keys().map(String::as_str).collect();
    factory_keys.sort_unstable();
    assert_eq!(factory_keys, ["bundles", "strategy"]);
    assert_eq!(plan["placement_group_factory"]["strategy"], "PACK");
    assert_eq!(plan["scaling_config"]["num_workers"], 2);
    assert_eq!(
        plan["scaling_config"]["resources_per_worker"],
        json!({"memory": 10000})
    );
}

#[test]
fn key_value_syntax_splits_reserved_and_custom_resources() {
    let plan = plan_json(&["-n", "2", "-r", "CPU=1,memory=10GB,custom=2"]);
    for worker in workers(&plan) {
        assert_eq!(
            worker["actor_options"],
            json!({
                "num_cpus": 1,
                "num_gpus": 0,
                "memory": 10_000_000_000_u64,
                "object_store_memory": null,
                "resources": {"custom": 2}
            })
        );
    }
    assert_eq!(
        bundles(&plan),
        &vec![json!({"CPU": 1, "custom": 2, "memory": 10_000_000_000_u64}); 2]
    );
    assert_eq!(
        plan["total_resources"],
        json!({"CPU": 2, "custom": 4, "memory": 20_000_000_000_u64})
    );
}

#[test]
fn trainer_resources_merge_into_bundle_zero_only() {
    let plan = plan_json(&["-n", "3", "--trainer-resources", "CPU=1", "-r", "CPU=2"]);
    assert_eq!(
        bundles(&plan),
        &vec![json!({"CPU": 3}), json!({"CPU": 2}), json!({"CPU": 2})]
    );
    assert_eq!(plan["total_resources"], json!({"CPU": 7}));
    // The coordinator's reservation is not part of any worker's actor options.
    for worker in workers(&plan) {
        assert_eq!(worker["actor_options"]["num_cpus"], 2);
    }
}

#[test]
fn use_gpu_and_accelerator_type_reach_the_actor_options() {
    let plan = plan_json(&[
        "-n",
        "2",
        "--use-gpu",
        "--accelerator-type",
        "A100",
        "-s",
        "SPREAD",
    ]);
    assert_eq!(
        bundles(&plan),
        &vec![json!({"GPU": 1, "accelerator_type:A100": 0.001}); 2]
    );
    assert_eq!(
        plan["total_resources"],
        json!({"GPU": 2, "accelerator_type:A100": 0.002})
    );
    assert_eq!(plan["placement_group_factory"]["strategy"], "SPREAD");
    for worker in workers(&plan) {
        assert_eq!(worker["actor_options"]["num_cpus"], 0);
        assert_eq!(worker["actor_options"]["num_gpus"], 1);
        assert_eq!(
            worker["actor_options"]["resources"],
            json!({"accelerator_type:A100": 0.001})
        );
    }
}

#[test]
fn a_toml_config_file_is_loaded() {
    let dir = TempDir::new("toml");
    let file = dir.file(
        "scaling.toml",
        "num_workers = 3\nresources_per_worker = { CPU = 2, memory = \"1GiB\" }\nplacement_strategy = \"STRICT_SPREAD\"\n",
    );
    let plan = plan_json(&["-c", path_arg(&file)]);
    assert_eq!(
        bundles(&plan),
        &vec![json!({"CPU": 2, "memory": 1_073_741_824}); 3]
    );
    assert_eq!(plan["placement_group_factory"]["strategy"], "STRICT_SPREAD");
}

#[test]
fn a_json_config_file_is_loaded() {
    let dir = TempDir::new("json");
    let file = dir.file(
        "scaling.json",
        r#"{"num_workers": 2, "use_gpu": true, "resources_per_worker": {"CPU": 1, "GPU": 0.5}, "trainer_resources": {"CPU": 1}}"#,
    );
    let plan = plan_json(&["--config", path_arg(&file)]);
    assert_eq!(
        bundles(&plan),
        &vec![json!({"CPU": 2, "GPU": 0.5}), json!({"CPU": 1, "GPU": 0.5})]
    );
    assert_eq!(workers(&plan)[1]["actor_options"]["num_gpus"], 0.5);
}

#[test]
fn flags_override_the_config_file() {
    let dir = TempDir::new("override");
    let file = dir.file(
        "scaling.toml",
        "num_workers = 4\nresources_per_worker = { CPU = 2 }\nplacement_strategy = \"SPREAD\"\n",
    );
    let plan = plan_json(&[
        "-c",
        path_arg(&file),
        "-n",
        "2",
        "-r",
        "CPU=1,custom=1",
        "-s",
        "PACK",
    ]);
    assert_eq!(bundles(&plan), &vec![json!({"CPU": 1, "custom": 1}); 2]);
    assert_eq!(plan["placement_group_factory"]["strategy"], "PACK");
    // Fields the flags leave alone keep the file's value.
    let plan = plan_json(&["-c", path_arg(&file), "--trainer-resources", "CPU=1"]);
    assert_eq!(bundles(&plan).len(), 4);
    assert_eq!(bundles(&plan)[0], json!({"CPU": 3}));
    assert_eq!(plan["placement_group_factory"]["strategy"], "SPREAD");
}

/// Runs `trainyard plan ARGS --format text`, expecting success, and returns stdout.
fn plan_text(args: &[&str]) -> String {
    let output = trainyard()
        .arg("plan")
        .args(args)
        .args(["--format", "text"])
        .output()
        .expect("trainyard runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "plan {args:?} failed: {stderr}");
    assert!(stderr.is_empty(), "plan {args:?} wrote to stderr: {stderr}");
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// The table rows of a text plan, split at whitespace: `[range, "×", count, bundle, options...]`.
fn text_rows(stdout: &str) -> Vec<Vec<&str>> {
    stdout
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .filter(|words| {
            words
                .first()
                .is_some_and(|w| w.split('-').all(|n| n.parse::<usize>().is_ok()))
        })
        .collect()
}

#[test]
fn text_format_groups_consecutive_identical_bundles_into_one_row() {
    let stdout = plan_text(&[
        "-n",
        "3",
        "--trainer-resources",
        "CPU=1",
        "-r",
        "CPU=2,memory=1000",
    ]);
    let rows = text_rows(&stdout);
    // (bundles, count, bundle resources)
    let expected = [
        ("0", "1", "CPU=3,memory=1KB"),
        ("1-2", "2", "CPU=2,memory=1KB"),
    ];
    assert_eq!(rows.len(), expected.len(), "{stdout}");
    for (row, (range, count, bundle)) in rows.iter().zip(expected) {
        assert_eq!(row[..4], [range, "×", count, bundle], "{stdout}");
        assert_eq!(
            row[4..],
            [
                "num_cpus=2",
                "num_gpus=0",
                "memory=1KB",
                "object_store_memory=-",
                "resources=-"
            ],
            "{stdout}"
        );
    }
    assert!(stdout.contains("PACK"), "{stdout}");
}

#[test]
fn a_hundred_thousand_identical_workers_print_one_row_but_every_worker_in_json() {
    let stdout = plan_text(&["-n", "100000"]);
    let rows = text_rows(&stdout);
    assert_eq!(rows.len(), 1, "{stdout}");
    assert_eq!(
        rows[0][..4],
        ["0-99999", "×", "100000", "CPU=1"],
        "{stdout}"
    );
    assert!(stdout.lines().count() < 12, "{stdout}");

    let plan = plan_json(&["-n", "100000"]);
    assert_eq!(workers(&plan).len(), 100_000);
    assert_eq!(bundles(&plan).len(), 100_000);
}

#[test]
fn text_says_that_bundle_zero_also_holds_the_trainers_resources() {
    let stdout = plan_text(&["-n", "2", "--trainer-resources", "CPU=1,memory=1GiB"]);
    let note = "bundle 0 also reserves the trainer's CPU=1,memory=1GiB (not part of worker 0's actor options)";
    assert_eq!(stdout.lines().last(), Some(note), "{stdout}");
    // Without trainer resources there is nothing to explain.
    let stdout = plan_text(&["-n", "2"]);
    assert!(!stdout.contains("also reserves"), "{stdout}");
}

#[test]
fn text_shows_nothing_as_a_dash_and_numbers_as_numbers() {
    let stdout = plan_text(&["-n", "2"]);
    assert!(!stdout.contains("{}"), "{stdout}");
    assert!(
        stdout.lines().any(|line| line == "trainer             -"),
        "{stdout}"
    );
    let rows = text_rows(&stdout);
    assert!(
        rows[0].contains(&"num_gpus=0")
            && rows[0].contains(&"memory=0")
            && rows[0].contains(&"object_store_memory=-")
            && rows[0].contains(&"resources=-"),
        "{stdout}"
    );
    let stdout = plan_text(&["-r", "CPU=1,object_store_memory=512MiB,custom=2"]);
    let rows = text_rows(&stdout);
    assert!(
        rows[0].contains(&"object_store_memory=512MiB") && rows[0].contains(&"resources=custom=2"),
        "{stdout}"
    );
}

#[test]
fn text_is_the_default_format() {
    let output = trainyard()
        .args(["plan", "-n", "2"])
        .output()
        .expect("trainyard runs");
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    assert!(serde_json::from_str::<Value>(&stdout).is_err(), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("0-1 ") && l.contains("CPU=1")),
        "{stdout}"
    );
}

#[test]
fn bad_inputs_exit_2_with_one_error_line_and_no_panic() {
    let dir = TempDir::new("bad");
    let unknown_field = dir.file("unknown.toml", "num_workers = 2\nbogus = 1\n");
    let unknown_field = path_arg(&unknown_field);
    let broken_table = dir.file(
        "broken.toml",
        "num_workers = 2\nresources_per_worker = { CPU = 1\nuse_gpu = false\n",
    );
    let broken_table = path_arg(&broken_table);
    let multi_line_json = "{\n  \"CPU\": 1,\n  \"custom\": \"lots\"\n}";
    // (all arguments, a piece of text the error line must contain)
    let cases: &[(&[&str], &str)] = &[
        (&["plan", "-n", "0"], "num_workers"),
        (&["plan", "-n", "-1"], "got -1"),
        (&["plan", "-n", "abc"], "abc"),
        (
            &["plan", "-n", "4000000000"],
            "`num_workers` must be between 1 and 1000000, got 4000000000",
        ),
        (
            &["plan", "-n", "99999999999"],
            "`num_workers` must be between 1 and 1000000, got 99999999999",
        ),
        (&["plan", "-r", "CPU=-1"], "negative"),
        (
            &["plan", "--use-gpu", "-r", "GPU=1.5"],
            "GPU quantities above 1 must be whole numbers, got 1.5",
        ),
        (&["plan", "-r", r#"{"GPU":1}"#], "`use_gpu` is false"),
        (
            &["plan", "--use-gpu", "-r", r#"{"GPU":0}"#],
            "`use_gpu` is true but `GPU` is 0",
        ),
        (&["plan", "-r", r#"{"memory":"ten GB"}"#], "ten GB"),
        (&["plan", "-r", r#"{"CPU":0.00001}"#], "0.0001"),
        (&["plan", "-r", "{}"], "at least one resource"),
        (&["plan", "-r", "CPU"], "NAME=AMOUNT"),
        (&["plan", "-r", multi_line_json], r#"{\n  "CPU": 1,\n"#),
        (&["plan", "-s", "RANDOM"], "RANDOM"),
        (&["plan", "--bogus-flag"], "--bogus-flag"),
        // clap's "did you mean" hints survive the folding into one line.
        (
            &["plan", "--placement_strategy", "SPREAD"],
            "error: unexpected argument '--placement_strategy' found; tip: a similar argument exists: '--placement-strategy'",
        ),
        (
            &["plann"],
            "unrecognized subcommand 'plann'; tip: a similar subcommand exists: 'plan'",
        ),
        (
            &["plan", "--format", "jsno"],
            "[possible values: text, json]; tip: a similar value exists: 'json'",
        ),
        (
            &["run", "-n", "2"],
            "the following required arguments were not provided: <PROGRAM>",
        ),
        (&["plan", "-c", "/nonexistent.toml"], "/nonexistent.toml"),
        (&["plan", "-c", unknown_field], "unknown field `bogus`"),
        (&["plan", "-c", broken_table], "at line 2, column "),
        (&["plan", "--format", "yaml"], "yaml"),
        (&[], "a subcommand is required: plan"),
    ];
    for (args, needle) in cases {
        let output = trainyard().args(*args).output().expect("trainyard runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            output.stdout.is_empty(),
            "{args:?} printed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
        assert!(lines[0].starts_with("error:"), "{args:?}: {stderr}");
        assert!(
            lines[0].contains(needle),
            "{args:?}: expected {needle:?} in {stderr}"
        );
        assert!(
            !stderr.contains("panicked") && !stderr.contains("backtrace"),
            "{args:?}: {stderr}"
        );
    }
}

#[test]
fn a_reader_that_closes_the_pipe_early_is_not_an_error() {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["plan", "-n", "200000", "--format", "json"])
        .env("RUST_BACKTRACE", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("trainyard starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("one line arrives");
    assert_eq!(first.trim_end(), "{");
    drop(stdout);
    let output = child.wait_with_output().expect("trainyard exits");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn fractional_amounts_in_json_output_parse_back_exactly() {
    let plan = plan_json(&["-r", "CPU=1.5014"]);
    assert_eq!(plan["total_resources"]["CPU"].to_string(), "1.5014");
    let dir = TempDir::new("round-trip");
    let file = dir.file("plan.json", &plan["scaling_config"].to_string());
    let again = plan_json(&["-c", path_arg(&file)]);
    assert_eq!(again, plan);
}

/// `plan --cluster FILE` puts each bundle where the simulated runtime, given the same nodes,
/// then puts the workers: the same reservation rules on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_on_a_described_cluster_agrees_with_a_simulated_run() {
    use trainyard::runtime::sim::{SimNode, SimRuntime};
    use trainyard::runtime::{ActorRuntime, ActorSpec};

    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("cluster.json");
    std::fs::write(
        &file,
        r#"{"nodes": [
            {"id": "small", "resources": {"CPU": 2, "memory": "4GB"}},
            {"id": "gpu", "resources": {"CPU": 8, "GPU": 2, "memory": "32GB"}},
            {"id": "big", "resources": {"CPU": 16, "memory": "64GB"}}
        ]}"#,
    )
    .expect("write");
    let file = file.display().to_string();
    let cases: &[&[&str]] = &[
        &[
            "-n",
            "3",
            "-r",
            r#"{"CPU": 2, "memory": "4GB"}"#,
            "-s",
            "SPREAD",
        ],
        &["-n", "2", "--use-gpu", "-r", r#"{"CPU": 1, "GPU": 1}"#],
        &[
            "-n",
            "4",
            "-r",
            r#"{"CPU": 4, "memory": "16GB"}"#,
            "-s",
            "PACK",
        ],
        &["-n", "2", "-r", "CPU=3", "-s", "STRICT_SPREAD"],
    ];
    for args in cases {
        let mut full = vec!["--cluster", file.as_str()];
        full.extend_from_slice(args);
        let json = plan_json(&full);
        let planned: Vec<String> = json["placement"]["placed"]["bundle_nodes"]
            .as_array()
            .unwrap_or_else(|| panic!("{args:?} is placed: {json}"))
            .iter()
            .map(|node| node.as_str().expect("a node id").to_owned())
            .collect();
        let factory: trainyard::runtime::PlacementGroupFactory =
            serde_json::from_value(json["placement_group_factory"].clone()).expect("factory");

        let sim = SimRuntime::new([
            SimNode::new("small").cpus(2).memory(4_000_000_000),
            SimNode::new("gpu").cpus(8).gpus(2).memory(32_000_000_000),
            SimNode::new("big").cpus(16).memory(64_000_000_000),
        ]);
        let pg = sim.create_placement_group(&factory).await.expect("group");
        sim.wait_placement_group_ready(pg, std::time::Duration::from_secs(5))
            .await
            .expect("ready");
        let workers = json["workers"].as_array().expect("workers");
        let mut ran = Vec::new();
        for (index, worker) in workers.iter().enumerate() {
            let options = serde_json::from_value(worker["actor_options"].clone()).expect("options");
            let spec = ActorSpec {
                name: format!("worker-{index}"),
                options,
                placement: Some((pg, index)),
                env: Default::default(),
            };
            let actor = sim.spawn(spec).await.expect("spawn");
            ran.push(sim.actor_node(actor).expect("placed").to_string());
        }
        assert_eq!(planned, ran, "{args:?}");
    }
}
