use super::common::{arg, run, stderr, table_value, temp};

fn fails_with(args: &[&str], code: i32, message: &str) {
    let out = run(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "trainer {args:?}: {}",
        stderr(&out)
    );
    assert_eq!(stderr(&out), format!("{message}\n"), "trainer {args:?}");
}

#[test]
fn bad_values_exit_2_with_one_line() {
    let f32 = "configs/f32.toml";
    fails_with(
        &["--config", f32, "--set", "train.batch_size=0"],
        2,
        "config error: train.batch_size = 0: must be at least 1",
    );
    fails_with(
        &["--config", f32, "--set", "train.lr=-1"],
        2,
        "config error: train.lr = -1: must be a finite number > 0",
    );
    fails_with(
        &["--config", f32, "--set", "model.name=vgg"],
        2,
        "config error: model.name: unknown variant `vgg`, expected one of `simple`, `mobilenet`, \
         `resnet`, `gpt`",
    );
    fails_with(
        &["--config", f32, "--set", "train.batch_size=big"],
        2,
        "config error: train.batch_size: invalid type: string \"big\", expected usize",
    );
}

#[test]
fn unknown_key_in_a_file_exits_2() {
    let dir = temp("unknown-key");
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[train]\nbatch = 32\n").unwrap();
    fails_with(
        &["--config", &arg(&path)],
        2,
        "config error: train.batch: unknown field `batch`, expected one of `batch_size`, `epochs`, \
         `max_steps`, `optimizer`, `lr`, `momentum`, `weight_decay`, `seed`, `output_dir`, \
         `accum_steps`, `lr_schedule`, `warmup_steps`, `min_lr`, `grad_clip_norm`, \
         `checkpoint_every`",
    );
}

#[test]
fn unreadable_or_broken_files_exit_2() {
    fails_with(
        &["--config", "configs/missing.toml"],
        2,
        "config error: cannot read config configs/missing.toml: No such file or directory (os error 2)",
    );
    let dir = temp("broken");
    let path = dir.join("broken.toml");
    std::fs::write(&path, "[model]\nname = \"simple\"\n[train\n").unwrap();
    let out = run(&["--config", &arg(&path)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).starts_with(&format!(
            "config error: {}:3: not valid TOML: ",
            path.display()
        )),
        "{}",
        stderr(&out)
    );
}

#[test]
fn missing_cifar_files_exit_2_naming_the_file() {
    let dir = temp("no-cifar");
    fails_with(
        &[
            "--backend",
            "cpu",
            "--set",
            "data.source=cifar10",
            "--set",
            &format!("data.path={}", arg(&dir)),
            // Its own folder: a runs/amp left by the README's main command adds a note.
            "--set",
            &format!("train.output_dir={}", arg(&dir.join("run"))),
        ],
        2,
        &format!(
            "error: cannot read {}: No such file or directory (os error 2)",
            dir.join("data_batch_1.bin").display()
        ),
    );
}

#[test]
fn cifar_files_in_the_binary_format_train() {
    let dir = temp("cifar");
    for name in [
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
        "test_batch",
    ] {
        let mut bytes = Vec::new();
        for i in 0..20usize {
            bytes.push((i % 10) as u8);
            bytes.extend((0..3072).map(|p| ((i * 7 + p) % 256) as u8));
        }
        std::fs::write(dir.join(format!("{name}.bin")), bytes).unwrap();
    }
    let out = run(&[
        "--backend",
        "cpu",
        "--max-steps",
        "3",
        "--set",
        "train.batch_size=16",
        "--set",
        "data.source=cifar10",
        "--set",
        &format!("data.path={}", arg(&dir)),
        "--set",
        &format!("train.output_dir={}", arg(&dir.join("run"))),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        table_value(&stdout, "steps").as_deref(),
        Some("3"),
        "{stdout}"
    );
}

#[test]
fn help_shows_examples() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Examples:") && help.contains("--set train.batch_size=32"),
        "{help}"
    );
}

/// Flags are range-checked by clap before anything loads: exit 2, the flag named.
#[test]
fn bad_flag_values_exit_2_naming_the_flag() {
    let cases: [(&[&str], &str); 6] = [
        (
            &["compare", "configs/f32.toml", "--steps", "0"],
            "error: invalid value '0' for '--steps <N>': must be at least 1",
        ),
        (
            &["find-batch-size", "--margin", "1"],
            "error: invalid value '1' for '--margin <FRACTION>': must be in [0, 1)",
        ),
        (
            &["find-batch-size", "--max-batch", "0"],
            "error: invalid value '0' for '--max-batch <N>': must be at least 1",
        ),
        (
            &["find-batch-size", "--max-seq-len", "65537"],
            "error: invalid value '65537' for '--max-seq-len <N>': must be at most 65536 (the \
             bound of model.seq_len)",
        ),
        (
            &["find-batch-size", "--search", "seq"],
            "error: invalid value 'seq' for '--search <SEARCH>'",
        ),
        (
            &["find-batch-size", "--budget", "lots"],
            "error: invalid value 'lots' for '--budget <SIZE>': expected a positive size such \
             as \"6GiB\", \"512MiB\", \"1.5GB\" or \"800000000\" (bytes)",
        ),
    ];
    for (args, first_line) in cases {
        let out = run(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "trainer {args:?}: {}",
            stderr(&out)
        );
        assert_eq!(
            stderr(&out).lines().next(),
            Some(first_line),
            "trainer {args:?}"
        );
    }
}

/// A child run reports its failure as JSON (compare and find-batch-size read it): the kind,
/// the exit code and the line it printed.
#[test]
fn failures_are_reported_as_json_when_asked() {
    let dir = temp("failure-json");
    let path = dir.join("failure.json");
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
    };
    let path_arg = arg(&path);
    let out = run(&["--set", "train.batch_size=0", "--failure-json", &path_arg]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        read(),
        serde_json::json!({
            "kind": "bad-input",
            "code": 2,
            "message": "config error: train.batch_size = 0: must be at least 1",
        })
    );
    let out = run(&[
        "--backend",
        "cpu",
        "--set",
        "memory.budget=1MiB",
        "--failure-json",
        &path_arg,
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let failure = read();
    assert_eq!(failure["kind"], "out-of-memory");
    assert_eq!(failure["code"], 3);
    assert_eq!(
        failure["message"],
        "out of memory before training: over memory.budget = 1.0 MiB"
    );
}

#[test]
fn bad_distributed_settings_exit_2_with_one_line() {
    let f32 = "configs/f32.toml";
    let cases = [
        (
            "distributed.devices=[\"gpu\"]",
            "config error: distributed.devices = [\"gpu\"]: \"gpu\" is not a device: \"cpu\" or \
             \"cuda:<index>\"",
        ),
        (
            "distributed.devices=[]",
            "config error: distributed.devices = []: one peer per entry: 1 to 64 devices",
        ),
        (
            "distributed.devices=[\"cpu\",\"cuda:0\"]",
            "config error: distributed.devices = [\"cpu\", \"cuda:0\"]: every device of one kind: \
             all \"cpu\" or all \"cuda:<index>\"",
        ),
        (
            "distributed.devices=[\"cuda:0\",\"cuda:0\"]",
            "config error: distributed.devices = [\"cuda:0\", \"cuda:0\"]: cuda:0 is listed \
             twice: one peer per CUDA device",
        ),
        (
            "distributed.timeout_s=0",
            "config error: distributed.timeout_s = 0: seconds a peer waits for the others: 1 to \
             86400",
        ),
        (
            "distributed.strategy=\"star\"",
            "config error: distributed.strategy: unknown variant `star`, expected one of `tree`, \
             `ring`, `centralized`",
        ),
        (
            "distributed.shard=\"weights\"",
            "config error: distributed.shard: unknown variant `weights`, expected one of `none`, \
             `optimizer`, `optimizer+gradients`",
        ),
    ];
    for (set, line) in cases {
        fails_with(&["--config", f32, "--set", set], 2, line);
    }
    fails_with(
        &[
            "--config",
            f32,
            "--backend",
            "wgpu",
            "--set",
            "distributed.devices=[\"cpu\",\"cpu\"]",
        ],
        2,
        "config error: distributed.devices = [\"cpu\", \"cpu\"]: backend.kind = \"wgpu\" cannot \
         run them (set it to \"cpu\" or \"auto\")",
    );
}

#[test]
fn bad_node_settings_and_launch_flags_exit_2_with_one_line() {
    let f32 = "configs/f32.toml";
    let nodes = "distributed.nodes=2";
    let at = "distributed.orchestrator=\"ws://127.0.0.1:80\"";
    let cases: [(&[&str], &str); 5] = [
        (
            &[nodes],
            "config error: distributed.nodes = 2: several nodes need distributed.orchestrator = \
             \"ws://HOST:PORT\"",
        ),
        (
            &[nodes, "distributed.orchestrator=\"127.0.0.1:80\""],
            "config error: distributed.orchestrator = \"127.0.0.1:80\": an address \
             ws://HOST:PORT (HOST a name or IP, PORT 1 to 65535)",
        ),
        (
            &[nodes, at, "distributed.node_rank=2"],
            "config error: distributed.node_rank = 2: this node's rank among distributed.nodes = \
             2: 0 to 1",
        ),
        (
            &[at],
            "config error: distributed.orchestrator = \"ws://127.0.0.1:80\": only with \
             distributed.nodes > 1",
        ),
        (
            &["distributed.nodes=3", at, "distributed.strategy=\"ring\""],
            "config error: distributed.strategy = ring: burn-collective's ring across 3 nodes \
             refuses tensors of fewer elements than nodes: use \"tree\" or \"centralized\"",
        ),
    ];
    for (sets, line) in cases {
        let mut args = vec!["--config", f32];
        for set in sets {
            args.extend(["--set", set]);
        }
        fails_with(&args, 2, line);
    }
    fails_with(
        &["launch", "--nodes", "2", "--config", f32, "--set", nodes],
        2,
        "config error: --set distributed.nodes=2: trainer launch sets the nodes, their ranks and \
         addresses: leave it out",
    );
    fails_with(
        &["launch", "--nodes", "2", "--bogus"],
        2,
        "config error: trainer launch: its training flags: unexpected argument '--bogus' found",
    );
    fails_with(
        &["launch", "--nodes", "2", "estimate"],
        2,
        "config error: trainer launch: runs training: give it training flags, not a command",
    );
}

#[test]
fn launch_on_a_taken_port_exits_2_before_anything_starts() {
    let taken = std::net::TcpListener::bind(("0.0.0.0", 0)).unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let args = [
        "launch",
        "--nodes",
        "2",
        "--port",
        &port,
        "--config",
        "configs/f32.toml",
    ];
    fails_with(
        &args,
        2,
        &format!(
            "config error: trainer launch --port {port}: cannot listen there: Address already in \
             use (os error 98)"
        ),
    );
}
