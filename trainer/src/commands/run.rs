//! The default command: train one config and print its summary.

use super::{dry_run_ok, settings};
use crate::backend::{self, Selected};
use crate::backend::{CpuBackend, CpuCheckpointed, CudaBackend, CudaCheckpointed};
use crate::backend::{WgpuBackend, WgpuCheckpointed};
use crate::cli::RunArgs;
use crate::config::{unsupported_dtype, Checkpointing, Purpose};
use crate::distributed::train;
use crate::memory::catch;
use crate::memory::cube::{self, device_memory};
use crate::memory::diagnosis;
use crate::memory::estimate::Target;
use crate::memory::heap::{Heap, HeapProbe};
use crate::memory::host;
use crate::memory::human;
use crate::outputs;
use crate::training::checkpoint;
use crate::training::interrupt::{Interrupt, Interrupted, Stopped};
use crate::training::RunOptions;

/// Trains, prints the summary table and writes `--summary-json`; after a signal (`interrupt`)
/// it stops cleanly: before the output folder is made, with nothing made; after, with a
/// checkpoint.
pub fn run(cli: RunArgs, dry: bool, interrupt: &Interrupt) -> anyhow::Result<()> {
    let settings = settings(
        cli.config.config.as_deref(),
        &cli.config.overrides,
        &cli.flag_overrides(),
        Purpose::Train,
    )?;
    if dry {
        return dry_run_ok(&format!("{} loads", settings.path.display()));
    }
    if let Some(note) = &settings.precision.note {
        eprintln!("note: {note}");
    }
    host::check(&settings)?;
    // CubeCL's search settings first: it reads them when the first device is made.
    let _fresh_cache = backend::configure_cubecl(&settings).map(RemoveOnDrop);
    // The device and its dtypes are settled before any output folder is made.
    let selected = backend::select_for(&settings)?;
    if let Some(half) = settings.precision.mode.half() {
        if !selected.supports(half) {
            return Err(unsupported_dtype(settings.precision.mode, &selected.name()).into());
        }
    }
    if let Some(signal) = interrupt.requested() {
        let what = "stopped before training began; nothing was written".into();
        return Err(Stopped { signal, what }.into());
    }
    // Over several nodes only node 0 writes: the others make no folder and print no summary.
    let node = settings.distributed.as_ref().and_then(|d| d.nodes.clone());
    let writes = node.as_ref().is_none_or(|n| n.rank == 0);
    // The output folder stays this run's until it ends (the lock is released with `owned`).
    let (settings, owned) = match cli.trial || !writes {
        true => (settings, None),
        false => {
            let (settings, lock) = outputs::prepare(
                settings,
                cli.resume.as_deref(),
                cli.overwrite,
                cli.summary_json.as_deref(),
            )?;
            (settings, Some(lock))
        }
    };
    if !cli.trial && writes {
        let output = settings.train.output_dir.clone();
        interrupt.on_second(move || {
            // Stopped before the first checkpoint: a folder holding nothing but this run's
            // lock file is given up.
            outputs::forget_if_unused(&output);
            checkpoint::describe(&checkpoint::dir(&output))
        });
    }
    let target = Target::of(selected.kind());
    let fits = || -> anyhow::Result<()> {
        if !cli.trial && !cli.skip_memory_check {
            diagnosis::check_budget(&settings, target)?;
            if let Selected::Cuda(device) = &selected {
                if let Some((free, total)) = device_memory(device.index) {
                    diagnosis::check_free(&settings, &selected.name(), free, total)?;
                }
            }
        }
        Ok(())
    };
    if let Err(over) = fits() {
        // Nothing was trained: a folder this run made for it is given up.
        drop(owned);
        outputs::forget_if_unused(&settings.train.output_dir);
        return Err(over);
    }
    let options = RunOptions {
        resume: cli.resume.as_deref(),
        trial: cli.trial,
        interrupt: Some(interrupt),
    };
    let balanced = settings.memory.checkpointing == Checkpointing::Balanced;
    let s = &settings;
    let summary = catch::catch(s, target, |last| match &selected {
        Selected::Cpu => {
            let (mut heap, devices) = (HeapProbe::new(Heap), backend::cpu_peers(s));
            let probe = &mut last.track(&mut heap);
            match balanced {
                false => train::<CpuBackend>(s, devices, &selected, options, probe),
                true => train::<CpuCheckpointed>(s, devices, &selected, options, probe),
            }
        }
        Selected::Cuda(device) => {
            // Rank 0's device is the one measured.
            let devices = backend::cuda_peers(s, device)?;
            let mut cuda = cube::cuda(device.clone());
            let probe = &mut last.track(&mut cuda);
            match balanced {
                false => train::<CudaBackend>(s, devices, &selected, options, probe),
                true => train::<CudaCheckpointed>(s, devices, &selected, options, probe),
            }
        }
        Selected::Wgpu(adapter) => {
            let mut wgpu = cube::wgpu(adapter.device.clone());
            let (probe, devices) = (&mut last.track(&mut wgpu), vec![adapter.device.clone()]);
            match balanced {
                false => train::<WgpuBackend>(s, devices, &selected, options, probe),
                true => train::<WgpuCheckpointed>(s, devices, &selected, options, probe),
            }
        }
    });
    let summary = match (summary, &node) {
        (Ok(summary), _) if writes => summary,
        (Ok(summary), Some(node)) => {
            let peak = summary.memory.peak_bytes.map_or("n/a".into(), human);
            eprintln!(
                "node {} of {}: trained {} steps with the others (peak {peak}, optimizer \
                 state {}); node 0 wrote the outputs",
                node.rank,
                node.count,
                summary.steps,
                summary.optimizer_state_bytes.map_or("n/a".into(), human)
            );
            return Ok(());
        }
        // A stop by a signal: node 0 wrote the checkpoint, this node nothing.
        (Err(e), Some(node)) if !writes => {
            return Err(match e.downcast::<Interrupted>() {
                Ok(i) => Stopped {
                    signal: i.signal,
                    what: format!(
                    "node {} stopped with the others after step {}; node 0 wrote the checkpoint",
                    node.rank, i.step
                ),
                }
                .into(),
                Err(e) => e,
            })
        }
        (result, _) => result?,
    };
    print!("{}", summary.table());
    if let Some(path) = &cli.summary_json {
        summary.write_json(path)?;
    }
    Ok(())
}

/// A folder removed when the run ends, however it ends (`backend.autotune_cache = "fresh"`).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        // Best effort: it lies in the temporary folder, which the system cleans anyway.
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
