//! Issue 33's "must show": real third-party MCP servers (none of the
//! reference servers), from the npm registry and PyPI, each written in a
//! Claude Desktop config the way its README writes it (`npx -y PKG@V`,
//! `uvx PKG@V`, a `node /path/main.js VAULT` script, env vars as shown),
//! imported with `moat import`, locked once, and served by `moat serve
//! --locked` under the default `sandbox = "required"` with no hand edit in
//! between. The official TypeScript SDK and the official Python SDK each
//! drive the whole config in one session, and every call's real output is
//! checked (the value read back from the file, the table, the graph).
//! The registries are the only network, and only at import.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use moat_host::Config;
use moat_host::config::{DirMode, Sandbox};

fn moat(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_moat"));
    command
        .current_dir(dir)
        .env("MOAT_DATA_DIR", dir.join("data"))
        .env(
            "MOAT_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-cache"),
        )
        .env("MOAT_STATE_DIR", common::state_dir());
    command
}

fn succeeded(output: Output, what: &str) -> String {
    assert!(
        output.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The calls one agent session makes; `who` keeps one SDK's files apart
/// from the other's.
fn calls(who: &str) -> serde_json::Value {
    serde_json::json!([
        // 0-1 knowledge graph (npm), its file named in env MEMORY_FILE_PATH.
        {"name": "knowledge-graph__create_entities", "arguments": {"entities": [
            {"name": format!("Heron-{who}"), "entityType": "bird", "observations": ["wingspan 185 cm"]}]}},
        {"name": "knowledge-graph__read_graph", "arguments": {}},
        // 2-3 memory bank (npm), its root named in env MEMORY_BANK_ROOT.
        {"name": "memory-bank__memory_bank_write", "arguments": {
            "projectName": "birds", "fileName": format!("heron-{who}.md"),
            "content": format!("The heron waits in the reeds ({who}).")}},
        {"name": "memory-bank__memory_bank_read", "arguments": {
            "projectName": "birds", "fileName": format!("heron-{who}.md")}},
        // 4-5 obsidian-mcp as a plain `node main.js VAULT` script.
        {"name": "notes__create-note", "arguments": {
            "vault": "vault", "filename": format!("Heron-{who}.md"),
            "content": format!("The heron stands still ({who}).")}},
        {"name": "notes__read-note", "arguments": {"vault": "vault", "filename": "Wren.md"}},
        // 6-8 excel-mcp-server (PyPI), its `--allow-dir` workbooks.
        {"name": "excel__create_workbook", "arguments": {"path": format!("budget-{who}.xlsx")}},
        {"name": "excel__write_range", "arguments": {
            "path": format!("budget-{who}.xlsx"), "sheet": "Sheet1", "at": "A1",
            "rows": [["rent", 1200], ["food", 300], ["total", "=SUM(B1:B2)"]]}},
        {"name": "excel__read_range", "arguments": {
            "path": format!("budget-{who}.xlsx"), "sheet": "Sheet1", "range": "A3:B3"}},
        // 9-10 mcp-server-motherduck (PyPI): DuckDB in memory, read-write.
        {"name": "duckdb__execute_query", "arguments": {"sql":
            "CREATE TABLE birds AS SELECT * FROM (VALUES ('heron', 185), ('wren', 15)) t(name, wingspan_cm)"}},
        {"name": "duckdb__execute_query", "arguments": {"sql":
            "SELECT name FROM birds WHERE wingspan_cm > 100"}},
        // 11-13 arxiv-mcp-server (PyPI): a stored paper read, a watch
        // written into and read back from its `--storage-path`.
        {"name": "arxiv__read_paper", "arguments": {"paper_id": "2401.12345"}},
        {"name": "arxiv__watch_topic", "arguments": {"topic": format!("ti:heron-{who}")}},
        {"name": "arxiv__list_watches", "arguments": {}},
        // 14 @negokaz/excel-mcp-server (npm, a Go binary): its README's
        // config names no path, so nothing of the host is granted, and its
        // tools only open workbooks that exist.
        {"name": "excel-go__excel_describe_sheets", "arguments": {
            "fileAbsolutePath": "/tmp/none.xlsx"}},
        // 15-16 MCP Toolbox for Databases (npm, a Go binary beside a node
        // launcher): a table created in, and read back from, the SQLite
        // file its env SQLITE_DATABASE names.
        {"name": "sqlite__execute_sql", "arguments": {"sql": format!(
            "CREATE TABLE nests_{who} (bird TEXT, eggs INTEGER); INSERT INTO nests_{who} VALUES ('heron', 4), ('wren', 6)")}},
        {"name": "sqlite__execute_sql", "arguments": {"sql": format!(
            "SELECT bird FROM nests_{who} WHERE eggs > 5")}},
        // 17-18 database-mcp-sqlite (PyPI): the SQLite file its `--dsn`
        // names, queried, and a write refused by its read-only default.
        {"name": "census__execute_sql", "arguments": {"sql":
            "SELECT bird, count FROM sightings WHERE count > 10"}},
        {"name": "census__execute_sql", "arguments": {"sql": "DELETE FROM sightings"}},
    ])
}

/// Checks one SDK's report of [`calls`]`(who)`.
fn check(report: &serde_json::Value, who: &str, dir: &Path) {
    let tools = report["tools"].as_array().unwrap();
    for server in [
        "excel-go",
        "knowledge-graph",
        "memory-bank",
        "notes",
        "excel",
        "duckdb",
        "arxiv",
        "sqlite",
        "census",
    ] {
        assert!(
            tools
                .iter()
                .any(|t| t.as_str().unwrap().starts_with(&format!("{server}__"))),
            "{who}: {server} lists its tools: {tools:?}"
        );
    }
    let result = |i: usize| -> (bool, String) {
        let r = &report["results"][i];
        (
            r["isError"].as_bool().unwrap(),
            r["text"].as_str().unwrap().to_owned(),
        )
    };
    let ok = |i: usize, needles: &[&str]| -> String {
        let (error, text) = result(i);
        assert!(!error, "{who}: call {i} failed: {text}");
        for needle in needles {
            assert!(
                text.contains(needle),
                "{who}: call {i}: {needle:?} in {text}"
            );
        }
        text
    };
    let heron = format!("Heron-{who}");
    ok(0, &[&heron]);
    ok(1, &[&heron, "wingspan 185 cm"]);
    ok(2, &[]);
    ok(3, &[&format!("The heron waits in the reeds ({who}).")]);
    ok(4, &[]);
    ok(5, &["Small and loud."]);
    ok(6, &[]);
    ok(7, &[]);
    // The formula's value, computed from what was written.
    let total: serde_json::Value = serde_json::from_str(&ok(8, &[])).unwrap();
    assert_eq!(
        total["values"],
        serde_json::json!([["total", 1500]]),
        "{who}"
    );
    ok(9, &[]);
    let rows: serde_json::Value = serde_json::from_str(&ok(10, &[])).unwrap();
    assert_eq!(rows["rows"], serde_json::json!([["heron"]]), "{who}");
    ok(11, &["Herons at dusk", "A study of wading birds."]);
    ok(12, &[]);
    ok(13, &[&format!("ti:heron-{who}")]);
    let (error, text) = result(14);
    assert!(error && text.contains("no such file"), "{who}: {text}");
    ok(15, &[]);
    let rows = ok(16, &["wren"]);
    assert!(!rows.contains("heron"), "{who}: {rows}");
    // A summary line, then the rows as JSON.
    let text = ok(17, &["1 rows"]);
    let rows: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(
        rows["rows"],
        serde_json::json!([{"bird": "wren", "count": 12}]),
        "{who}"
    );
    let (error, text) = result(18);
    assert!(
        error && text.contains("read-only: statement 'DELETE' is blocked"),
        "{who}: {text}"
    );

    // What the servers wrote is on the host, where the config said.
    let graph = std::fs::read_to_string(dir.join("graph/memory.jsonl")).unwrap();
    assert!(graph.contains(&heron), "{graph}");
    assert_eq!(
        std::fs::read_to_string(dir.join(format!("memory-bank/birds/heron-{who}.md"))).unwrap(),
        format!("The heron waits in the reeds ({who}).")
    );
    assert!(
        std::fs::read_to_string(dir.join(format!("vault/Heron-{who}.md")))
            .unwrap()
            .contains(&format!("The heron stands still ({who})."))
    );
    assert!(dir.join(format!("workbooks/budget-{who}.xlsx")).is_file());
    let watches = std::fs::read_to_string(dir.join("papers/watched_topics.json")).unwrap();
    assert!(watches.contains(&format!("ti:heron-{who}")), "{watches}");
    // The table is in the database file on the host.
    let output = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchall())")
        .arg(dir.join("db/birds.db"))
        .arg(format!("SELECT bird, eggs FROM nests_{who} ORDER BY bird"))
        .output()
        .expect("python3");
    assert_eq!(
        succeeded(output, "reading the SQLite file").trim(),
        "[('heron', 4), ('wren', 6)]",
        "{who}"
    );
    // The refused DELETE left the census as it was.
    let output = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchall())")
        .arg(dir.join("census/census.db"))
        .arg("SELECT bird, count FROM sightings ORDER BY bird")
        .output()
        .expect("python3");
    assert_eq!(
        succeeded(output, "reading the census").trim(),
        "[('heron', 3), ('wren', 12)]",
        "{who}"
    );
}

#[test]
fn third_party_servers_from_a_claude_desktop_config_run_with_no_hand_edits() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        root.join("target/npm/node_modules/@modelcontextprotocol/sdk")
            .exists()
            && root.join("target/py/mcp").exists(),
        "run `bash tests/setup.sh` (the README's test command does)"
    );
    // Not under /tmp, nor in a hidden directory: obsidian-mcp refuses
    // either for a vault.
    let tmp = tempfile::Builder::new()
        .prefix("third-party-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let dir = std::fs::canonicalize(tmp.path()).unwrap();
    for sub in [
        "graph",
        "memory-bank",
        "vault/.obsidian",
        "workbooks",
        "papers",
        "db",
        "census",
    ] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    std::fs::write(dir.join("vault/.obsidian/app.json"), "{}\n").unwrap();
    std::fs::write(dir.join("vault/Wren.md"), "# Wren\n\nSmall and loud.\n").unwrap();
    std::fs::write(
        dir.join("papers/2401.12345.md"),
        "# Herons at dusk\n\nA study of wading birds.\n",
    )
    .unwrap();
    // database-mcp-sqlite queries a database that exists: the census.
    let output = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.commit()")
        .arg(dir.join("census/census.db"))
        .arg("CREATE TABLE sightings (bird TEXT, count INTEGER); INSERT INTO sightings VALUES ('heron', 3), ('wren', 12);")
        .output()
        .expect("python3");
    succeeded(output, "writing the census");
    // obsidian-mcp's README: `node <absolute-path-to-obsidian-mcp>/build/main.js VAULT`.
    let script = dir.join("script");
    let output = Command::new("npm")
        .args([
            "install",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            "--prefix",
        ])
        .arg(&script)
        .arg("obsidian-mcp@1.0.6")
        .output()
        .expect("npm");
    succeeded(output, "npm install obsidian-mcp");
    let main_js = script.join("node_modules/obsidian-mcp/build/main.js");

    std::fs::write(
        dir.join("claude_desktop_config.json"),
        serde_json::json!({"mcpServers": {
            "excel-go": {"command": "npx", "args": ["--yes", "@negokaz/excel-mcp-server@0.12.0"],
                         "env": {"EXCEL_MCP_PAGING_CELLS_LIMIT": "4000"}},
            "knowledge-graph": {"command": "npx", "args": ["-y", "@itseasy21/mcp-knowledge-graph@1.0.7"],
                                "env": {"MEMORY_FILE_PATH": dir.join("graph/memory.jsonl")}},
            "memory-bank": {"type": "stdio", "command": "npx", "args": ["-y", "@allpepper/memory-bank-mcp@0.2.2"],
                            "env": {"MEMORY_BANK_ROOT": dir.join("memory-bank")}},
            "notes": {"command": "node", "args": [main_js, dir.join("vault")]},
            "excel": {"command": "uvx", "args": ["excel-mcp-server@2.2.2", "stdio", "--allow-dir", dir.join("workbooks")]},
            "duckdb": {"command": "uvx", "args": ["mcp-server-motherduck@1.1.0", "--db-path", ":memory:", "--read-write", "--allow-switch-databases"]},
            "arxiv": {"command": "uvx", "args": ["arxiv-mcp-server@0.8.2", "--storage-path", dir.join("papers")]},
            // MCP Toolbox for Databases' SQLite guide, run from npm as its
            // package's README says (`npx @toolbox-sdk/server --prebuilt
            // sqlite --stdio`); the file does not exist yet.
            "sqlite": {"command": "npx", "args": ["-y", "@toolbox-sdk/server@1.12.0", "--prebuilt", "sqlite", "--stdio"],
                       "env": {"SQLITE_DATABASE": dir.join("db/birds.db")}},
            // database-mcp-sqlite's quick start (`uvx database-mcp-sqlite
            // --dsn /absolute/path/to/database.db`): read-only unless
            // started with --allow-write, which its README's config is not.
            "census": {"command": "uvx", "args": ["database-mcp-sqlite@0.2.1", "--dsn", dir.join("census/census.db")]}
        }})
        .to_string(),
    )
    .unwrap();
    let output = moat(&dir)
        .arg("import")
        .arg(dir.join("claude_desktop_config.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let toml = succeeded(output, "moat import");
    let config_path = dir.join("moat.toml");
    std::fs::write(&config_path, &toml).unwrap();

    // What import inferred: the data each server writes is granted
    // read-write, from its arguments or its env; a file by its directory.
    let config = Config::load(&config_path).unwrap();
    assert_eq!(config.servers.len(), 9, "{toml}\n{stderr}");
    for (name, spec) in &config.servers {
        assert_eq!(spec.sandbox, Sandbox::Required, "{name}");
        assert!(spec.sha256.is_some() && !spec.allow_unmeasured, "{name}");
        assert!(spec.net.is_empty(), "{name}: {:?}", spec.net);
        assert_eq!(
            spec.package().is_some(),
            name != "notes",
            "{name}: {toml}\n{stderr}"
        );
    }
    let rw = |name: &str, path: &Path| {
        assert!(
            config
                .server(name)
                .unwrap()
                .dirs
                .iter()
                .any(|d| d.host == path && d.mode == DirMode::Rw),
            "{name}: {} read-write\n{toml}\n{stderr}",
            path.display()
        );
    };
    rw("knowledge-graph", &dir.join("graph"));
    rw("memory-bank", &dir.join("memory-bank"));
    rw("notes", &dir.join("vault"));
    rw("excel", &dir.join("workbooks"));
    rw("arxiv", &dir.join("papers"));
    rw("sqlite", &dir.join("db"));
    // The census is granted (its name matches the writers' `mcp-sqlite`,
    // so read-write, though the server opens it read-only).
    assert!(
        config
            .server("census")
            .unwrap()
            .dirs
            .iter()
            .any(|d| d.host == dir.join("census")),
        "census: {toml}\n{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "`knowledge-graph`: grants read-write {}, the directory of {} (named in its env MEMORY_FILE_PATH)",
            dir.join("graph").display(),
            dir.join("graph/memory.jsonl").display()
        )),
        "{stderr}"
    );

    succeeded(
        moat(&dir)
            .args(["lock", "--config"])
            .arg(&config_path)
            .output()
            .unwrap(),
        "moat lock",
    );

    let output = common::ts_client("ts_calls.mjs", &config_path)
        .arg(calls("ts").to_string())
        .output()
        .expect("running node");
    let report: serde_json::Value =
        serde_json::from_str(&succeeded(output, "the TypeScript SDK")).unwrap();
    check(&report, "ts", &dir);

    let output = common::py_client("py_calls.py", &config_path)
        .arg(calls("py").to_string())
        .output()
        .expect("running python3");
    let report: serde_json::Value =
        serde_json::from_str(&succeeded(output, "the Python SDK")).unwrap();
    check(&report, "py", &dir);
}
