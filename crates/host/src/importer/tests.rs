use std::path::{Path, PathBuf};

use crate::command::resolve;

use super::*;

#[test]
fn claude_desktop_config_becomes_moat_entries() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("claude_desktop_config.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {
            "files": {"command": "sh", "args": ["-c", "echo $(x)"], "env": {"TOKEN": "t"}},
            "my server!": {"command": "/nonexistent/bin/srv"},
            "remote": {"url": "https://example.invalid/mcp"}
        }}"#,
    )
    .unwrap();
    let path_var = std::env::var_os("PATH");
    let imported = import(&file, path_var.as_deref(), None).unwrap();
    let parsed = crate::config::Config::parse(&dir.path().join("moat.toml"), &imported.toml)
        .expect("the imported entries are a valid moat.toml");
    let files = parsed.server("files").unwrap();
    assert_eq!(files.args, ["-c", "echo $(x)"]);
    assert!(files.sha256.is_some(), "{}", imported.toml);
    let renamed = parsed.server("my-server-").unwrap();
    assert!(renamed.allow_unmeasured);
    assert!(parsed.server("remote").is_err());
    let skipped = imported.skipped.join("\n");
    assert!(
        skipped.contains("`remote`: a remote server at https://example.invalid/mcp"),
        "{skipped}"
    );
    assert!(
        skipped.contains("`my server!`: renamed to `my-server-`"),
        "{skipped}"
    );
    assert!(
        skipped.contains("not found") || skipped.contains("does not exist"),
        "{skipped}"
    );
}

#[test]
fn grants_are_inferred_and_secrets_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("project");
    std::fs::create_dir(&project).unwrap();
    let package = dir.path().join("node_modules/server-x");
    std::fs::create_dir_all(package.join("dist")).unwrap();
    std::fs::write(package.join("package.json"), "{}").unwrap();
    std::fs::write(package.join("dist/index.js"), "").unwrap();
    let file = dir.path().join("claude.json");
    let config = serde_json::json!({"mcpServers": {
        "filesystem": {"command": "node", "args": [
            dir.path().join("node_modules/server-filesystem/dist/index.js"),
            project
        ]},
        "x": {"command": "node", "args": [package.join("dist/index.js"), "--root", project],
              "env": {"GITHUB_TOKEN": "ghp_secret", "API_KEY": "k", "LOG_LEVEL": "debug"}}
    }});
    std::fs::create_dir_all(dir.path().join("node_modules/server-filesystem/dist")).unwrap();
    std::fs::write(
        dir.path()
            .join("node_modules/server-filesystem/package.json"),
        "{}",
    )
    .unwrap();
    std::fs::write(
        dir.path()
            .join("node_modules/server-filesystem/dist/index.js"),
        "",
    )
    .unwrap();
    std::fs::write(&file, config.to_string()).unwrap();
    let imported = import(&file, std::env::var_os("PATH").as_deref(), None).unwrap();
    assert!(!imported.toml.contains("ghp_secret"), "{}", imported.toml);
    let parsed = crate::config::Config::parse(&dir.path().join("moat.toml"), &imported.toml)
        .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
    let real = |p: &Path| std::fs::canonicalize(p).unwrap();
    let grants = |name: &str| -> Vec<(PathBuf, crate::grants::DirMode)> {
        parsed
            .server(name)
            .unwrap()
            .dirs
            .iter()
            .map(|d| (d.host.clone(), d.mode))
            .collect()
    };
    use crate::grants::DirMode::{Ro, Rw};
    assert_eq!(
        grants("filesystem"),
        [
            (real(&dir.path().join("node_modules/server-filesystem")), Ro),
            (real(&project), Rw)
        ],
        "the filesystem server's purpose is writing its directories"
    );
    assert_eq!(grants("x"), [(real(&package), Ro), (real(&project), Ro)]);
    let x = parsed.server("x").unwrap();
    let crate::config::ServerKind::Native {
        measure, command, ..
    } = &x.kind
    else {
        panic!("native");
    };
    assert_eq!(measure, &[real(&package)]);
    // Issue 33: a bare name is written as the file it was on PATH, so
    // an agent's other PATH cannot run another file under that name.
    let node = resolve("node", Path::new("/"), std::env::var_os("PATH").as_deref()).unwrap();
    assert_eq!(Path::new(command), node.found);
    assert!(
        imported
            .skipped
            .iter()
            .any(|n| n.contains("`node` is ") && n.contains("on Moat's PATH at import")),
        "{:?}",
        imported.skipped
    );
    assert_eq!(x.env.passthrough, ["API_KEY", "GITHUB_TOKEN"]);
    assert_eq!(
        x.env.values.get("LOG_LEVEL").map(String::as_str),
        Some("debug")
    );
    let notes = imported.skipped.join("\n");
    assert!(
        notes.contains("`x`: env GITHUB_TOKEN looks like a secret: its value was not copied"),
        "{notes}"
    );
}

/// Issue 33: what a writer writes is granted read-write with no hand
/// edit: a directory in its arguments, a path in its env, and a file
/// (its database, its graph, one it is yet to create) by its directory,
/// where a journal or a new copy goes beside it. A reader's stay
/// read-only, and a file in a directory no implicit grant may be is
/// granted alone.
#[test]
fn writers_data_is_granted_read_write_from_arguments_and_env() {
    let dir = tempfile::tempdir().unwrap();
    let real = |p: &Path| std::fs::canonicalize(p).unwrap();
    let workbooks = dir.path().join("workbooks");
    let graph = dir.path().join("graph");
    let db = dir.path().join("db");
    for d in [&workbooks, &graph, &db] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(db.join("birds.db"), "").unwrap();
    let file = dir.path().join("claude.json");
    std::fs::write(
        &file,
        serde_json::json!({"mcpServers": {
            "excel": {"command": "/nonexistent/excel-mcp-server", "args": ["stdio", "--allow-dir", workbooks]},
            "graph": {"command": "/nonexistent/mcp-knowledge-graph",
                      "env": {"MEMORY_FILE_PATH": graph.join("memory.jsonl"), "LOG_LEVEL": "debug", "API_KEY": "/not/a/grant"}},
            "sqlite": {"command": "/nonexistent/mcp-server-sqlite", "args": ["--db-path", db.join("birds.db")]},
            "reader": {"command": "/nonexistent/reader", "args": [workbooks, graph.join("gone.db")],
                       "env": {"DATA": db.join("birds.db")}},
            "root": {"command": "/nonexistent/mcp-server-sqlite", "args": ["--db-path", "/nonexistent-moat.db"]}
        }})
        .to_string(),
    )
    .unwrap();
    let imported = import(&file, None, None).unwrap();
    let parsed = crate::config::Config::parse(&dir.path().join("moat.toml"), &imported.toml)
        .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
    let grants = |name: &str| -> Vec<(PathBuf, crate::grants::DirMode)> {
        parsed
            .server(name)
            .unwrap()
            .dirs
            .iter()
            .map(|d| (d.host.clone(), d.mode))
            .collect()
    };
    use crate::grants::DirMode::{Ro, Rw};
    assert_eq!(grants("excel"), [(real(&workbooks), Rw)]);
    assert_eq!(grants("graph"), [(real(&graph), Rw)], "{}", imported.toml);
    assert_eq!(grants("sqlite"), [(real(&db), Rw)]);
    assert_eq!(
        grants("reader"),
        [(real(&workbooks), Ro), (real(&db.join("birds.db")), Ro)]
    );
    assert!(grants("root").is_empty(), "{}", imported.toml);
    let notes = imported.skipped.join("\n");
    assert!(
        notes.contains(&format!(
            "`graph`: grants read-write {}, the directory of {} (named in its env MEMORY_FILE_PATH)",
            real(&graph).display(),
            graph.join("memory.jsonl").display()
        )),
        "{notes}"
    );
    assert!(
        notes.contains("`root`: /nonexistent-moat.db (named in its arguments) is a file it writes, but its directory / is not granted"),
        "{notes}"
    );
}

/// Issue 33: a launcher option Moat does not know is named, with the
/// entry, and nothing is installed under a guess at what it meant.
#[test]
fn an_unknown_launcher_option_is_named_with_its_entry() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("claude.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {
            "time": {"command": "uvx", "args": ["--python", "3.12", "mcp-server-time"]},
            "memory": {"command": "npx", "args": ["-y", "--registry", "https://r.example", "@modelcontextprotocol/server-memory"]}
        }}"#,
    )
    .unwrap();
    let store = dir.path().join("store");
    let imported = import(&file, None, Some(&store)).unwrap();
    let notes = imported.skipped.join("\n");
    assert!(
        notes.contains("`time`: `uvx`: option --python is not understood by Moat's import (it knows --from PKG, --with REQ and -q)"),
        "{notes}"
    );
    assert!(
        notes.contains("`memory`: `npx`: option --registry is not understood"),
        "{notes}"
    );
    assert!(!store.exists(), "nothing was installed");
    let parsed = crate::config::Config::parse(&dir.path().join("moat.toml"), &imported.toml)
        .unwrap_or_else(|e| panic!("{e}\n{}", imported.toml));
    let time = parsed.server("time").unwrap();
    assert!(time.package().is_none());
    assert_eq!(time.args, ["--python", "3.12", "mcp-server-time"]);
}

#[test]
fn vs_code_config_and_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mcp.json");
    std::fs::write(&file, r#"{"servers": {"a": {"type": "stdio", "command": "sh"}, "b": {"type": "http", "url": "http://127.0.0.1:1/mcp"}}}"#).unwrap();
    let imported = import(&file, std::env::var_os("PATH").as_deref(), None).unwrap();
    assert!(imported.toml.contains("[servers.a]"));
    assert!(!imported.toml.contains("[servers.b]"));
    std::fs::write(&file, "{}").unwrap();
    assert!(matches!(
        import(&file, None, None),
        Err(ImportError::Format { .. })
    ));
    assert_eq!(server_name("a__b c"), "a_b-c");
}

/// Installs overlap: each fake `npm install` below waits (up to 20 s) for
/// the other one to have started, so installed one after the other, the
/// first gives up and neither package is installed. Notes and entries
/// still come in the config's order.
#[cfg(unix)]
#[test]
fn a_configs_packages_are_installed_at_the_same_time_and_written_in_order() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    let met = dir.path().join("met");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&met).unwrap();
    let executable = |name: &str, text: String| {
        let path = bin.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    executable("node", "#!/bin/sh\nexit 0\n".into());
    // `npm install ... --prefix TMP -- NAME@VERSION`: says it started,
    // waits for the other install, then lays out what npm would.
    executable(
        "npm",
        format!(
            r#"#!/bin/sh
set -eu
PATH=/usr/bin:/bin
while [ "$1" != "--prefix" ]; do shift; done
prefix=$2; spec=$4; name=${{spec%@*}}; version=${{spec#*@}}
touch "{met}/$name"
other=alpha; [ "$name" = alpha ] && other=beta
tries=0
while [ ! -e "{met}/$other" ]; do
    tries=$((tries + 1)); [ $tries -gt 400 ] && {{ echo "npm: $other never started" >&2; exit 1; }}
    sleep 0.05
done
mkdir -p "$prefix/node_modules/$name"
printf '{{"name":"%s","version":"%s","bin":"main.js"}}' "$name" "$version" >"$prefix/node_modules/$name/package.json"
echo 'console.log(1)' >"$prefix/node_modules/$name/main.js"
printf '{{"lockfileVersion":3,"name":"%s"}}' "$name" >"$prefix/package-lock.json"
"#,
            met = met.display()
        ),
    );
    let file = dir.path().join("claude_desktop_config.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {
            "alpha": {"command": "npx", "args": ["-y", "alpha@1.0.0"]},
            "beta": {"command": "npx", "args": ["-y", "beta@2.0.0"]}
        }}"#,
    )
    .unwrap();
    let store = dir.path().join("store");
    let imported = import(&file, Some(bin.as_os_str()), Some(&store)).unwrap();
    let skipped = imported.skipped.join("\n");
    let installed = |name: &str, version: &str| {
        imported
            .skipped
            .iter()
            .position(|note| {
                note.starts_with(&format!(
                    "`{name}`: installed {name} {version} (npm `{name}`)"
                ))
            })
            .unwrap_or_else(|| panic!("{name} not installed:\n{skipped}"))
    };
    assert!(installed("alpha", "1.0.0") < installed("beta", "2.0.0"));
    let alpha = imported.toml.find("[servers.alpha]").unwrap();
    let beta = imported.toml.find("[servers.beta]").unwrap();
    assert!(alpha < beta, "{}", imported.toml);
}
