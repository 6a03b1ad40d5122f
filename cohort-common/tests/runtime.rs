//! Runtime identity against fake Pi packages and Node binaries on disk: what is a Pi CLI entry,
//! what is refused and how the refusal says what to use.

use cohort_common::identity::runtime::*;
use serde_json::json;
use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

#[test]
fn declared_cli_forms() {
    assert_eq!(
        declared_cli(&json!({"bin": "dist/cli.js"})),
        Some("dist/cli.js")
    );
    assert_eq!(
        declared_cli(&json!({"bin": {"pi": "dist/cli.js", "other": "x.js"}})),
        Some("dist/cli.js")
    );
    assert_eq!(declared_cli(&json!({"bin": {"pix": "a.js"}})), Some("a.js"));
    assert_eq!(
        declared_cli(&json!({"bin": {"a": "a.js", "b": "b.js"}})),
        None
    );
    assert_eq!(declared_cli(&json!({})), None);
}

fn fake_package(dir: &Path, name: &str) -> PathBuf {
    fs::create_dir_all(dir.join("dist")).unwrap();
    fs::write(
        dir.join("package.json"),
        json!({"name": name, "bin": {"pi": "dist/cli.js"}}).to_string(),
    )
    .unwrap();
    fs::write(dir.join("dist/cli.js"), "").unwrap();
    fs::write(dir.join("dist/other.js"), "").unwrap();
    dir.join("dist/cli.js")
}

fn fake_node(dir: &Path) -> PathBuf {
    let node = dir.join("node");
    fs::write(&node, "#!/bin/sh\n").unwrap();
    fs::set_permissions(&node, fs::Permissions::from_mode(0o755)).unwrap();
    node
}

#[test]
fn validates_a_pi_package() {
    let t = tempfile::tempdir().unwrap();
    let entry = fake_package(&t.path().join("pkg"), PI_PACKAGE_NAMES[0]);
    let node = fake_node(t.path());
    let rt = validate(&node, &entry).unwrap();
    assert_eq!(
        rt.pi_package_root,
        t.path().join("pkg").canonicalize().unwrap()
    );
    assert!(rt.pi_entry_path.is_absolute());
}

#[test]
fn refuses_wrong_entries() {
    let t = tempfile::tempdir().unwrap();
    let entry = fake_package(&t.path().join("pkg"), PI_PACKAGE_NAMES[1]);
    let node = fake_node(t.path());
    let other = entry.with_file_name("other.js");
    let err = validate(&node, &other).unwrap_err();
    assert!(matches!(err, RuntimeError::BadEntry { .. }));
    let declared = entry.canonicalize().unwrap();
    assert!(
        err.to_string().ends_with(&format!(
            "use {}, the package's declared CLI",
            declared.display()
        )),
        "{err}"
    );
    let foreign = fake_package(&t.path().join("foreign"), "left-pad");
    assert!(matches!(
        validate(&node, &foreign),
        Err(RuntimeError::BadEntry { .. })
    ));
    assert!(matches!(
        validate(&node, &t.path().join("missing.js")),
        Err(RuntimeError::BadEntry { .. })
    ));
}

#[test]
fn the_pi_0x_path_in_a_1x_package_is_refused_naming_the_bundle_cli() {
    // Pi 1.x ships dist/cli.js but declares dist/bundle/cli.js.
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("pkg");
    fs::create_dir_all(root.join("dist/bundle")).unwrap();
    fs::write(
        root.join("package.json"),
        json!({"name": PI_PACKAGE_NAMES[1], "bin": {"pi": "dist/bundle/cli.js"}}).to_string(),
    )
    .unwrap();
    fs::write(root.join("dist/cli.js"), "").unwrap();
    fs::write(root.join("dist/bundle/cli.js"), "").unwrap();
    let node = fake_node(t.path());
    let err = validate(&node, &root.join("dist/cli.js")).unwrap_err();
    let bundle = root.join("dist/bundle/cli.js").canonicalize().unwrap();
    assert!(
        err.to_string().contains(&format!(
            "use {}, the package's declared CLI",
            bundle.display()
        )),
        "{err}"
    );
    let rt = validate(&node, &root.join("dist/bundle/cli.js")).unwrap();
    assert_eq!(rt.pi_entry_path, bundle);
}

#[test]
fn package_info_reads_version_and_engines() {
    let info = PackageInfo::from_manifest(&json!({
        "name": PI_PACKAGE_NAMES[1], "version": "1.6.0", "engines": {"node": ">=22.19.0"}
    }));
    assert_eq!(info.name, PI_PACKAGE_NAMES[1]);
    assert_eq!(info.version.as_deref(), Some("1.6.0"));
    assert_eq!(info.node_engines.as_deref(), Some(">=22.19.0"));
    let bare = PackageInfo::from_manifest(&json!({"version": 1, "engines": "node"}));
    assert_eq!(bare, PackageInfo::default());

    let t = tempfile::tempdir().unwrap();
    fake_package(t.path(), PI_PACKAGE_NAMES[0]);
    assert_eq!(package_info(t.path()).unwrap().name, PI_PACKAGE_NAMES[0]);
    let err = package_info(&t.path().join("dist")).unwrap_err();
    assert!(err.to_string().contains("package.json"), "{err}");
}

#[test]
fn refuses_bad_node() {
    let t = tempfile::tempdir().unwrap();
    let entry = fake_package(&t.path().join("pkg"), PI_PACKAGE_NAMES[0]);
    let plain = t.path().join("plain");
    fs::write(&plain, "").unwrap();
    assert!(matches!(
        validate(&plain, &entry),
        Err(RuntimeError::BadNode { .. })
    ));
    assert!(matches!(
        validate(&t.path().join("nope"), &entry),
        Err(RuntimeError::BadNode { .. })
    ));
    assert!(matches!(
        validate(t.path(), &entry),
        Err(RuntimeError::BadNode { .. })
    ));
}

#[test]
fn finds_on_path_through_symlinks() {
    let t = tempfile::tempdir().unwrap();
    let entry = fake_package(&t.path().join("pkg"), PI_PACKAGE_NAMES[0]);
    fs::set_permissions(&entry, fs::Permissions::from_mode(0o755)).unwrap();
    let bin = t.path().join("bin");
    fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(&entry, bin.join("pi")).unwrap();
    let found = find_on_path("pi", bin.as_os_str()).unwrap();
    assert_eq!(found, entry.canonicalize().unwrap());
    assert!(find_on_path("pi", OsStr::new("relative/dir")).is_none());
}
