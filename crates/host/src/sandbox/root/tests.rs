use std::ffi::CString;
use std::path::Path;

use super::*;

#[test]
fn a_root_holds_parents_first_and_nothing_twice() {
    let options = CString::new("size=1024,mode=1777").unwrap();
    let plan = plan(&RootInputs {
        executable: Path::new("/bin/sh"),
        interpreter: None,
        roots: &[],
        measure: &[],
        dirs: &[],
        cwd: Path::new("/"),
        tmp_options: &options,
        resolv_conf: false,
    })
    .unwrap();
    let targets: Vec<String> = plan
        .subjects
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    // /bin/sh lies in /usr (or /bin): bound with it, not again.
    assert!(!targets.iter().any(|t| t.ends_with("/sh")), "{targets:?}");
    for needed in ["/usr", "/etc", "/tmp", "/proc", "/dev", "/dev/null"] {
        assert!(targets.iter().any(|t| t == needed), "{needed}: {targets:?}");
    }
    let position = |p: &str| targets.iter().position(|t| t == p).unwrap();
    assert!(position("/dev") < position("/dev/null"));
    let mut sorted = targets.clone();
    sorted.dedup();
    assert_eq!(sorted.len(), targets.len());
}
