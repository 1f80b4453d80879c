//! Where the configuration comes from: the file's path, and what overrides it.
//!
//! Order of precedence, last wins: the file, then `TRAINPROF_*` environment variables,
//! then command-line flags. Only four settings can be overridden: the local path, the
//! interval, the S3 output path and the kill switch.

use std::path::{Path, PathBuf};

use crate::DEFAULT_CONFIG_PATH;

/// A setting that the environment or a flag may override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverrideKey {
    LocalPath,
    IntervalMs,
    S3OutputPath,
    Disable,
}

impl OverrideKey {
    pub const ALL: [OverrideKey; 4] =
        [OverrideKey::LocalPath, OverrideKey::IntervalMs, OverrideKey::S3OutputPath, OverrideKey::Disable];

    /// The environment variable for this setting.
    pub fn env_var(self) -> &'static str {
        match self {
            OverrideKey::LocalPath => "TRAINPROF_LOCAL_PATH",
            OverrideKey::IntervalMs => "TRAINPROF_INTERVAL_MS",
            OverrideKey::S3OutputPath => "TRAINPROF_S3_OUTPUT_PATH",
            OverrideKey::Disable => "TRAINPROF_DISABLE",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Override {
    pub key: OverrideKey,
    pub value: String,
    /// `env:NAME` or `flag:--name`, for problem lines.
    pub origin: String,
}

/// The file's path, the overrides in the order they apply, and `SM_HPS`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sources {
    config_path: PathBuf,
    pub(crate) overrides: Vec<Override>,
    pub(crate) sm_hps: Option<String>,
}

impl Sources {
    /// No environment: the default path, nothing overridden.
    pub fn new() -> Sources {
        Sources { config_path: PathBuf::from(DEFAULT_CONFIG_PATH), overrides: Vec::new(), sm_hps: None }
    }

    /// Reads `SMPROFILER_CONFIG_PATH`, the `TRAINPROF_*` overrides and `SM_HPS` through
    /// `var` (pass `|k| std::env::var(k).ok()` for the process environment).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Sources {
        let mut s = Sources::new();
        if let Some(p) = var("SMPROFILER_CONFIG_PATH").filter(|p| !p.is_empty()) {
            s.config_path = PathBuf::from(p);
        }
        for key in OverrideKey::ALL {
            // An empty kill switch is "not set", never "on" (`TRAINPROF_DISABLE=` in a script).
            let value = var(key.env_var()).filter(|v| key != OverrideKey::Disable || !v.trim().is_empty());
            if let Some(value) = value {
                s.overrides.push(Override { key, value, origin: format!("env:{}", key.env_var()) });
            }
        }
        s.sm_hps = var("SM_HPS");
        s
    }

    /// The process environment.
    pub fn from_process_env() -> Sources {
        Sources::from_env(|k| std::env::var(k).ok())
    }

    /// Names the file explicitly (a `--config` flag or an argument), over the environment.
    pub fn with_config_path(mut self, path: impl Into<PathBuf>) -> Sources {
        self.config_path = path.into();
        self
    }

    /// Adds a command-line flag's value; it wins over the file and the environment.
    /// `flag` is the flag's name as typed, for problem lines (`--interval-ms`).
    pub fn with_flag(mut self, key: OverrideKey, flag: &str, value: impl Into<String>) -> Sources {
        self.overrides.push(Override { key, value: value.into(), origin: format!("flag:{flag}") });
        self
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }
}

impl Default for Sources {
    fn default() -> Sources {
        Sources::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_then_flags() {
        let env = |k: &str| match k {
            "SMPROFILER_CONFIG_PATH" => Some("/x/profiler.json".to_owned()),
            "TRAINPROF_INTERVAL_MS" => Some("200".to_owned()),
            _ => None,
        };
        let s = Sources::from_env(env).with_flag(OverrideKey::IntervalMs, "--interval-ms", "1000");
        assert_eq!(s.config_path(), Path::new("/x/profiler.json"));
        assert_eq!(s.overrides.len(), 2);
        assert_eq!(s.overrides[0].origin, "env:TRAINPROF_INTERVAL_MS");
        assert_eq!(s.overrides[1].origin, "flag:--interval-ms");
    }

    #[test]
    fn empty_config_path_variable_means_default() {
        let s = Sources::from_env(|k| (k == "SMPROFILER_CONFIG_PATH").then(String::new));
        assert_eq!(s.config_path(), Path::new(DEFAULT_CONFIG_PATH));
    }
}
