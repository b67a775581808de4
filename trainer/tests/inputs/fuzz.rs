//! A deterministic fuzz of config validation: every shipped config mutated hundreds of times
//! (values swapped for hostile ones, lines dropped or duplicated, text cut short, bytes
//! flipped) plus hostile `--set` strings, run in-process. No input may panic; every rejection
//! is one line; every accepted config can be estimated without overflow. The counts are
//! printed (`cargo test --test inputs fuzz -- --nocapture`) and recorded in docs.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use trainer::config::{load_for, Purpose};
use trainer::memory::estimate::{estimate, Target};

/// SplitMix64: a small seeded generator, so every run tries the same inputs.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const VALUES: [&str; 24] = [
    "0",
    "1",
    "-1",
    "4611686018427387904",
    "9223372036854775807",
    "1000000000000",
    "1e308",
    "-1e-45",
    "1e40",
    "nan",
    "inf",
    "0.5",
    "3",
    "\"\"",
    "\"../../x\"",
    "\"f16\"",
    "\"mobilenet\"",
    "\"dynamic\"",
    "true",
    "[1, 2]",
    "{ a = 1 }",
    "\"6GiB\"",
    "\"0B\"",
    "\"cifar10\"",
];

const KEYS: [&str; 32] = [
    "model.name",
    "model.num_classes",
    "model.input_size",
    "model.width_multiplier",
    "model.stem_stride",
    "data.source",
    "data.path",
    "data.train_size",
    "data.eval_size",
    "data.seed",
    "train.batch_size",
    "train.epochs",
    "train.max_steps",
    "train.optimizer",
    "train.lr",
    "train.momentum",
    "train.weight_decay",
    "train.output_dir",
    "train.accum_steps",
    "train.lr_schedule",
    "train.warmup_steps",
    "train.min_lr",
    "train.grad_clip_norm",
    "train.checkpoint_every",
    "precision.mode",
    "precision.loss_scale",
    "precision.init_scale",
    "precision.growth_interval",
    "backend.kind",
    "memory.budget",
    "memory.free_cache",
    "nosuch.key",
];

/// One mutation of `text`.
fn mutate(rng: &mut Rng, text: &str) -> String {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    match rng.below(6) {
        // A value replaced by a hostile one.
        0 | 1 => {
            let i = rng.below(lines.len().max(1));
            if let Some(line) = lines.get_mut(i) {
                if let Some((key, _)) = line.split_once('=') {
                    *line = format!("{key}= {}", rng.pick(&VALUES));
                }
            }
        }
        // A line dropped or duplicated.
        2 if !lines.is_empty() => {
            let i = rng.below(lines.len());
            if rng.below(2) == 0 {
                lines.remove(i);
            } else {
                let line = lines[i].clone();
                lines.insert(i, line);
            }
        }
        // A key appended to its section.
        3 => {
            let key = rng.pick(&KEYS);
            let (section, leaf) = key.split_once('.').unwrap_or(("x", key));
            lines.push(format!("[{section}]\n{leaf} = {}", rng.pick(&VALUES)));
        }
        // Cut short.
        4 => {
            let all = lines.join("\n");
            let cut = rng.below(all.len().max(1));
            let cut = (0..=cut)
                .rev()
                .find(|&c| all.is_char_boundary(c))
                .unwrap_or(0);
            return all[..cut].to_string();
        }
        // A byte flipped to another printable one.
        _ => {
            let mut bytes = lines.join("\n").into_bytes();
            if !bytes.is_empty() {
                let i = rng.below(bytes.len());
                if bytes[i].is_ascii() {
                    bytes[i] = b' ' + (rng.below(95) as u8);
                }
            }
            return String::from_utf8_lossy(&bytes).into_owned();
        }
    }
    lines.join("\n")
}

/// A hostile `--set` string.
fn hostile_set(rng: &mut Rng) -> String {
    match rng.below(5) {
        0 => "noequals".into(),
        1 => format!("={}", rng.pick(&VALUES)),
        2 => format!("{}.={}", rng.pick(&KEYS), rng.pick(&VALUES)),
        3 => format!("{}=1\n{}=2", rng.pick(&KEYS), rng.pick(&KEYS)),
        _ => format!("{}={}", rng.pick(&KEYS), rng.pick(&VALUES)),
    }
}

#[derive(Debug, Default)]
struct Counts {
    tried: usize,
    rejected: usize,
    accepted: usize,
    panics: usize,
}

#[test]
fn mutated_configs_never_panic_and_are_rejected_on_one_line() {
    let configs = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<Vec<_>>();
    let mut rng = Rng(2026);
    let mut counts = Counts::default();
    let mut bad = Vec::new();
    // Quiet: a panic would otherwise print its message for every failing input.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for i in 0..600 {
        let base = &configs[i % configs.len()];
        let mut text = base.clone();
        for _ in 0..=rng.below(3) {
            text = mutate(&mut rng, &text);
        }
        let sets: Vec<String> = (0..rng.below(3)).map(|_| hostile_set(&mut rng)).collect();
        counts.tried += 1;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let s = load_for(&text, Path::new("fuzz.toml"), &sets, Purpose::Train)?;
            // Whatever validation accepts, the estimate computes without overflowing.
            let _ = estimate(&s, Target::CpuHeap);
            let _ = estimate(&s, Target::Device);
            Ok::<_, trainer::config::ConfigError>(())
        }));
        match outcome {
            Ok(Ok(())) => counts.accepted += 1,
            Ok(Err(e)) => {
                counts.rejected += 1;
                let line = e.to_string();
                if line.is_empty() || line.contains('\n') {
                    bad.push(format!("{text:?} {sets:?}: {line:?}"));
                }
            }
            Err(_) => {
                counts.panics += 1;
                bad.push(format!("panic: {text:?} {sets:?}"));
            }
        }
    }
    std::panic::set_hook(hook);
    println!("fuzz: {counts:?}");
    assert!(counts.tried >= 500);
    assert!(counts.accepted > 0 && counts.rejected > 0, "{counts:?}");
    assert_eq!(counts.panics, 0, "{bad:#?}");
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The largest config validation accepts is estimated without overflow (the dev profile
/// checks every addition and multiplication).
#[test]
fn the_largest_accepted_config_estimates_without_overflow() {
    let sets: Vec<String> = [
        "model.name=mobilenet",
        "model.width_multiplier=4",
        "model.input_size=2048",
        "model.stem_stride=1",
        "model.num_classes=100000",
        "train.batch_size=65536",
        "train.accum_steps=16",
        "data.train_size=10000000",
        "data.eval_size=10000000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let s = load_for("", Path::new("max.toml"), &sets, Purpose::Estimate).unwrap();
    let e = estimate(&s, Target::CpuHeap);
    assert!(e.predicted_peak() > e.device_peak_bytes);
    assert!(
        e.device_peak_bytes > 1 << 45,
        "tens of TiB, not a wrapped small number"
    );
}
