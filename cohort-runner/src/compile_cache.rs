//! Node's compile cache for the Pi children: private to the user, outside the run.
//!
//! Pi 1.x turns on Node's compile cache, which Node 22 keeps under `os.tmpdir()` by default
//! (Node docs, `module.enableCompileCache`). The run's private `TMPDIR` is the wrong place (it
//! would cost every run about 1 MiB and a cold start, written when Pi exits, on the state
//! root's disk), and a shared `/tmp/node-compile-cache` is worse: one directory for every user
//! of the host, made by whoever came first, holding code Node loads and runs. So the children
//! get `NODE_COMPILE_CACHE=<cache dir>/cohort/node-compile-cache`, where the cache dir is
//! `$XDG_CACHE_HOME` (when absolute) or `~/.cache` ([`cache_dir`], pure), created 0700 and used
//! only when it is a directory of the user's own that nobody else can write ([`judge`], pure).
//! When there is no such directory, the cache is turned off for the child
//! (`NODE_DISABLE_COMPILE_CACHE=1`): slower starts, never someone else's code. A
//! `NODE_COMPILE_CACHE` already in the runner's environment is the user's choice and is left
//! as it is.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The variable Node reads the compile cache directory from.
pub const CACHE_ENV: &str = "NODE_COMPILE_CACHE";
/// The variable that turns Node's compile cache off.
pub const DISABLE_ENV: &str = "NODE_DISABLE_COMPILE_CACHE";

/// The compile cache directory for this environment (pure): `$XDG_CACHE_HOME/cohort/
/// node-compile-cache` when that variable is an absolute path, else `$HOME/.cache/cohort/
/// node-compile-cache` when `HOME` is an absolute path, else none.
pub fn cache_dir(xdg_cache_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    let absolute = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    let base = absolute(xdg_cache_home).or_else(|| absolute(home).map(|h| h.join(".cache")))?;
    Some(base.join("cohort").join("node-compile-cache"))
}

/// Why a cache directory with this kind, `owner` and `mode` (from `lstat`) may not be used by
/// user `me`, if it may not (pure): it must be a directory, not a link, owned by `me`, with no
/// permission for group or others.
pub fn judge(is_dir: bool, is_link: bool, owner: u32, mode: u32, me: u32) -> Option<&'static str> {
    if is_link {
        Some("is a symlink")
    } else if !is_dir {
        Some("is not a directory")
    } else if owner != me {
        Some("is owned by another user")
    } else if mode & 0o077 != 0 {
        Some("is open to its group or others")
    } else {
        None
    }
}

/// Create `dir` (0700, missing parents 0700 too) and check it with [`judge`] for the effective
/// uid. Errors: one line naming the directory and why it is not used.
pub fn prepare(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let m = std::fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot examine {}: {e}", dir.display()))?;
    let me = nix::unistd::geteuid().as_raw();
    let ft = m.file_type();
    match judge(ft.is_dir(), ft.is_symlink(), m.uid(), m.mode(), me) {
        None => Ok(()),
        Some(why) => Err(format!("{} {why}", dir.display())),
    }
}

/// The compile cache variables every Pi child of this runner gets, worked out once per runner
/// (the first call creates the directory): none when the runner's environment names a cache
/// already, else [`CACHE_ENV`] with the private directory, or [`DISABLE_ENV`] when there is
/// none (the reason is logged once to `runner.log`).
pub fn child_env() -> Vec<(&'static str, OsString)> {
    use std::sync::OnceLock;
    static ENV: OnceLock<Vec<(&'static str, OsString)>> = OnceLock::new();
    ENV.get_or_init(|| {
        if std::env::var_os(CACHE_ENV).is_some() {
            return Vec::new();
        }
        let dir = cache_dir(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME"))
            .ok_or_else(|| "neither XDG_CACHE_HOME nor HOME is an absolute path".to_string())
            .and_then(|d| prepare(&d).map(|()| d));
        match dir {
            Ok(d) => vec![(CACHE_ENV, d.into_os_string())],
            Err(why) => {
                crate::process::log(format_args!(
                    "Node's compile cache is off for this run's children: {why}"
                ));
                vec![(DISABLE_ENV, "1".into())]
            }
        }
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_lives_in_the_users_cache_dir() {
        let p = |s: &str| Some(OsString::from(s));
        let want = |s: &str| Some(PathBuf::from(s));
        assert_eq!(
            cache_dir(p("/x/cache"), p("/home/ada")),
            want("/x/cache/cohort/node-compile-cache")
        );
        assert_eq!(
            cache_dir(p("relative"), p("/home/ada")),
            want("/home/ada/.cache/cohort/node-compile-cache")
        );
        assert_eq!(
            cache_dir(None, p("/home/ada")),
            want("/home/ada/.cache/cohort/node-compile-cache")
        );
        assert_eq!(cache_dir(p(""), p("")), None);
        assert_eq!(cache_dir(None, None), None);
    }

    #[test]
    fn only_a_private_directory_of_the_user_is_used() {
        let me = 1000;
        assert_eq!(judge(true, false, me, 0o40700, me), None);
        assert_eq!(
            judge(true, false, me, 0o40755, me),
            Some("is open to its group or others")
        );
        assert_eq!(
            judge(true, false, me, 0o40770, me),
            Some("is open to its group or others")
        );
        assert_eq!(
            judge(true, false, 0, 0o40700, me),
            Some("is owned by another user")
        );
        assert_eq!(judge(false, true, me, 0o120777, me), Some("is a symlink"));
        assert_eq!(
            judge(false, false, me, 0o100600, me),
            Some("is not a directory")
        );
    }

    #[test]
    fn prepare_creates_the_directory_private_and_refuses_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("cache/cohort/node-compile-cache");
        prepare(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        prepare(&dir).unwrap();
        let other = t.path().join("elsewhere");
        std::fs::create_dir(&other).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&other, &link).unwrap();
        assert!(prepare(&link).unwrap_err().contains("is a symlink"));
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(prepare(&open).unwrap_err().contains("open to its group"));
    }
}
