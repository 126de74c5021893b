//! `--trace-out FILE` (run, bench, chat): the routing the engine did, one JSON line per
//! computed token in the format of the shared routing traces; `--route-trace FILE` (bench): a
//! trace's routing forced onto a model; `--learn` (run, bench, chat): the experts used,
//! added to the hotlist the next open preloads.

use super::args::Args;
use super::commands::Failure;
use waste::cache::replay::Trace;
use waste::Model;

/// The trace file being written and every line so far: each flush rewrites the whole file
/// (temp, fsync, rename), so a reader never sees half a line and a crash keeps the last one.
pub struct TraceOut {
    path: std::path::PathBuf,
    text: String,
}

impl TraceOut {
    /// Starts recording when `--trace-out` is given.
    pub fn start(a: &Args, model: &mut Model) -> Option<TraceOut> {
        let path = a.path("trace-out")?;
        model.record_routing(true);
        Some(TraceOut { path: path.to_path_buf(), text: String::new() })
    }

    /// Appends what the model routed since the last flush and writes the file.
    pub fn flush(&mut self, model: &mut Model) -> Result<(), Failure> {
        for token in model.take_routing() {
            self.text.push_str(&token.to_json_line());
            self.text.push('\n');
        }
        waste::format::safetensors::write_atomic(&self.path, self.text.as_bytes())?;
        Ok(())
    }
}

/// `--route-trace FILE`: loads the trace and hands it to the model.
pub fn replay(a: &Args, model: &mut Model) -> Result<(), Failure> {
    if let Some(p) = a.path("route-trace") {
        if model.info().experts.is_none() {
            return Err(Failure::Usage("option `--route-trace`: the model has no experts to route".into()));
        }
        model.replay_routing(Some(Trace::load(p)?));
    }
    Ok(())
}

/// `--learn`: starts counting expert usage.
pub fn learn(a: &Args, model: &mut Model) -> Result<(), Failure> {
    if a.flag("learn") {
        model.learn_usage(true).map_err(|e| Failure::Usage(format!("option `--learn`: {}", e.message())))?;
    }
    Ok(())
}

/// `--learn`: writes what was counted (added to the file's earlier counts) and starts again,
/// so a file rewritten after every chat turn never counts a token twice.
pub fn save_usage(a: &Args, model: &mut Model, say: bool) -> Result<(), Failure> {
    if a.flag("learn") {
        let path = model.write_usage(None)?;
        if say {
            super::out::errln!("waste: expert usage added to {}", path.display());
        }
    }
    Ok(())
}
