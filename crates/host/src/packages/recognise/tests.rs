use super::super::requirement::requirement_text;
use super::*;

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn launchers_are_recognised() {
    let r = recognise(
        "npx",
        &strings(&["-y", "@modelcontextprotocol/server-filesystem", "/p", "-x"]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.ecosystem, Ecosystem::Npm);
    assert_eq!(r.name, "@modelcontextprotocol/server-filesystem");
    assert_eq!(r.version, None);
    assert_eq!(r.entry, Entry::Program(None));
    assert_eq!(r.args, ["/p", "-x"]);

    let r = recognise("/usr/bin/npx", &strings(&["--yes", "@a/b@1.2.3"]))
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.name.as_str(), r.version.as_deref()),
        ("@a/b", Some("1.2.3"))
    );
    let r = recognise("pnpm", &strings(&["dlx", "-p", "pkg@2", "tool", "a"]))
        .unwrap()
        .unwrap();
    assert_eq!(r.entry, Entry::Program(Some("tool".into())));
    assert_eq!((r.name.as_str(), r.version.as_deref()), ("pkg", Some("2")));
    assert_eq!(r.launcher, "pnpm dlx");

    let r = recognise("uvx", &strings(&["mcp-server-git", "--repository", "/r"]))
        .unwrap()
        .unwrap();
    assert_eq!(r.ecosystem, Ecosystem::Python);
    assert_eq!(r.entry, Entry::Program(Some("mcp-server-git".into())));
    assert_eq!(r.args, ["--repository", "/r"]);
    let r = recognise("uvx", &strings(&["--from", "x==1.0", "x-cli"]))
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.name.as_str(), r.version.as_deref()),
        ("x", Some("==1.0"))
    );
    let r = recognise("uvx", &strings(&["mcp-server-time@2026.10.19"]))
        .unwrap()
        .unwrap();
    assert_eq!(r.version.as_deref(), Some("2026.10.19"));
    let r = recognise("pipx", &strings(&["run", "mcp-server-fetch"]))
        .unwrap()
        .unwrap();
    assert_eq!(r.name, "mcp-server-fetch");
    let r = recognise(
        "python3",
        &strings(&["-m", "mcp_server_time", "--tz", "UTC"]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.entry, Entry::Module("mcp_server_time".into()));
    assert_eq!(r.name, "mcp-server-time");
    assert_eq!(r.args, ["--tz", "UTC"]);

    assert!(recognise("node", &strings(&["x.js"])).is_none());
    assert!(recognise("pipx", &strings(&["install", "x"])).is_none());
    for (command, args, detail) in [
        ("npx", &["-y"][..], "no package is named"),
        (
            "npx",
            &["--registry", "r", "x"][..],
            "option --registry is not understood",
        ),
        ("uvx", &["./local"][..], "is not a registry package name"),
        (
            "uvx",
            &["--from", "a", "--from", "b", "c"][..],
            "option --from is given more than once",
        ),
        ("python3", &["-m", "os;x"][..], "expected a module name"),
        (
            "npx",
            &["@x/../../etc"][..],
            "is not a registry package name",
        ),
        ("npx", &["Upper"][..], "is not a registry package name"),
        (
            "uvx",
            &["pkg@ https://evil.example/x.whl"][..],
            "is not a version",
        ),
        (
            "uvx",
            &["--from", "pkg==1.0;python_version>'3'", "x"][..],
            "is not a version",
        ),
        (
            "uvx",
            &["git+https://example.com/x"][..],
            "is not a registry package name",
        ),
    ] {
        let error = recognise(command, &strings(args))
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(error.contains(detail), "{command} {args:?}: {error}");
    }
}

/// Issue 33: `uvx --with`, `uvx --from 'pkg[extra]==V' CMD`, `npx -p`
/// (repeated, `--package=`), `pipx run --spec`: what is installed,
/// beside what, and which program runs.
#[test]
fn launchers_name_extra_requirements_and_programs() {
    let r = recognise(
        "uvx",
        &strings(&[
            "--with",
            "tzdata==2025.2",
            "--with=six",
            "mcp-server-time@2026.10.19",
            "--local-timezone",
            "UTC",
        ]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        (r.name.as_str(), r.version.as_deref()),
        ("mcp-server-time", Some("2026.10.19"))
    );
    assert_eq!(r.with, ["tzdata==2025.2", "six"]);
    assert_eq!(r.entry, Entry::Program(Some("mcp-server-time".into())));
    assert_eq!(r.args, ["--local-timezone", "UTC"]);

    let r = recognise(
        "uvx",
        &strings(&[
            "--from",
            "excel-mcp-server[dev, docs]==2.2.2",
            "excel-mcp",
            "stdio",
        ]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.name, "excel-mcp-server");
    assert_eq!(r.extras, ["dev", "docs"]);
    assert_eq!(r.version.as_deref(), Some("==2.2.2"));
    assert_eq!(r.entry, Entry::Program(Some("excel-mcp".into())));
    assert_eq!(r.args, ["stdio"]);
    assert_eq!(
        requirement_text(Ecosystem::Python, &r.name, &r.extras, r.version.as_deref()),
        "excel-mcp-server[dev,docs]==2.2.2"
    );
    let r = recognise(
        "uvx",
        &strings(&["--with", "b[x]@1.0", "--from", "a", "cmd"]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        (r.name.as_str(), r.with.as_slice()),
        ("a", &["b[x]==1.0".to_owned()][..])
    );

    // npx: every -p is installed; the program's own package is the one
    // recorded, whatever its place.
    let r = recognise(
        "npx",
        &strings(&[
            "-y",
            "-p",
            "zod@3",
            "--package=@modelcontextprotocol/server-memory@2026.8.31",
            "server-memory",
            "--flag",
        ]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.name, "@modelcontextprotocol/server-memory");
    assert_eq!(r.version.as_deref(), Some("2026.8.31"));
    assert_eq!(r.with, ["zod@3"]);
    assert_eq!(r.entry, Entry::Program(Some("server-memory".into())));
    assert_eq!(r.args, ["--flag"]);
    let r = recognise("npx", &strings(&["-p", "a@1", "-p", "b", "tool"]))
        .unwrap()
        .unwrap();
    assert_eq!(
        (r.name.as_str(), r.with.as_slice()),
        ("a", &["b".to_owned()][..])
    );

    let r = recognise(
        "pipx",
        &strings(&[
            "run",
            "--spec",
            "mcp-server-fetch==2026.10.24",
            "mcp-server-fetch",
            "-x",
        ]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        (r.name.as_str(), r.version.as_deref()),
        ("mcp-server-fetch", Some("==2026.10.24"))
    );
    assert_eq!(r.entry, Entry::Program(Some("mcp-server-fetch".into())));
    assert_eq!(r.args, ["-x"]);
    let r = recognise(
        "pipx",
        &strings(&["run", "mcp-server-git==2026.10.19", "--repository", "/r"]),
    )
    .unwrap()
    .unwrap();
    assert_eq!(r.version.as_deref(), Some("==2026.10.19"));
    assert_eq!(r.entry, Entry::Program(Some("mcp-server-git".into())));
    assert_eq!(r.args, ["--repository", "/r"]);

    // An option a launcher does not have, or Moat does not know, is
    // refused by name, never taken for the package or the program.
    for (command, args, detail) in [
        (
            "uvx",
            &["--python", "3.12", "x"][..],
            "`uvx`: option --python is not understood",
        ),
        (
            "uvx",
            &["--with-editable", "./x", "y"][..],
            "option --with-editable is not understood",
        ),
        (
            "pipx",
            &["run", "--with", "a", "b"][..],
            "`pipx run`: option --with is not understood",
        ),
        (
            "pipx",
            &["run", "--from", "a", "b"][..],
            "option --from is not understood",
        ),
        (
            "npx",
            &["--with", "a", "b"][..],
            "option --with is not understood",
        ),
        ("npx", &["-c", "echo hi"][..], "option -c is not understood"),
        ("npx", &["-p", "a"][..], "no program to run from it follows"),
        ("uvx", &["--with"][..], "option --with needs a package"),
        (
            "uvx",
            &["--with", "./local", "x"][..],
            "is not a registry package name",
        ),
        ("uvx", &["--from", "x[a", "y"][..], "extras are not closed"),
        (
            "uvx",
            &["--from", "x[a/b]", "y"][..],
            "is not an extra's name",
        ),
        (
            "npx",
            &["-p", "a[x]", "y"][..],
            "is not a registry package name",
        ),
        ("npx", &["--yes=1", "a"][..], "option --yes takes no value"),
    ] {
        let error = recognise(command, &strings(args))
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(error.contains(detail), "{command} {args:?}: {error}");
    }
}
