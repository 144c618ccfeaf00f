use std::num::NonZeroU64;

use super::*;
use crate::identity::Expectation;
use crate::limits::Limits;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("/etc/moat/moat.toml"), text)
}

fn invalid_at(text: &str) -> (usize, usize, String) {
    match parse(text) {
        Err(ConfigError::Invalid {
            line,
            column,
            message,
            ..
        }) => (line, column, message),
        other => panic!("expected an invalid config, got {other:?}"),
    }
}

#[test]
fn full_server_entry_parses_with_paths_relative_to_the_config() {
    let config = parse(
        r#"
[servers.everything]
wasm = "guests/everything.wasm"
sha256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
args = ["--verbose"]
env = { MODE = "test" }
env_passthrough = ["HOME"]
[servers.everything.limits]
fuel_per_request = 5
request_timeout_ms = 100
"#,
    )
    .unwrap();
    let server = config.server("everything").unwrap();
    assert_eq!(
        server.kind,
        ServerKind::Wasm {
            source: WasmSource::File(PathBuf::from("/etc/moat/guests/everything.wasm")),
            instances: Instances::Call,
            preinit: true,
            http: Vec::new(),
        }
    );
    assert_eq!(server.limits.fuel_per_request, 5);
    assert_eq!(server.limits.request_timeout_ms, 100);
    assert_eq!(server.limits.memory_bytes, Limits::default().memory_bytes);
    assert_eq!(server.args, ["--verbose"]);
    assert!(matches!(server.expectation(), Some(Expectation::Pinned(_))));
}

#[test]
fn endpoints_are_https_or_loopback_http_without_credentials() {
    assert_eq!(
        parse_endpoint("https://mcp.example.com/mcp").unwrap(),
        "https://mcp.example.com/mcp"
    );
    assert!(parse_endpoint("http://127.0.0.1:8080/mcp").is_ok());
    assert!(parse_endpoint("http://[::1]:8080/mcp").is_ok());
    assert!(parse_endpoint("http://localhost/mcp").is_ok());
    let plain = parse_endpoint("http://mcp.example.com/mcp").unwrap_err();
    assert!(
        plain.contains("plain http is allowed to loopback addresses only"),
        "{plain}"
    );
    let creds = parse_endpoint("https://user:hunter2@mcp.example.com/mcp").unwrap_err();
    assert!(creds.contains("bearer_token_env"), "{creds}");
    assert!(!creds.contains("hunter2"), "{creds}");
    assert!(
        parse_endpoint("ftp://mcp.example.com/")
            .unwrap_err()
            .contains("scheme `ftp`")
    );
    assert!(
        parse_endpoint("https://mcp.example.com/#x")
            .unwrap_err()
            .contains("fragment")
    );
    assert!(
        parse_endpoint("not a url")
            .unwrap_err()
            .contains("is not a URL")
    );
}

#[test]
fn wasm_metering_is_fuel_unless_epoch_is_asked_for() {
    let config = parse("[servers.a]\nwasm = \"a.wasm\"\n").unwrap();
    assert_eq!(config.wasm.metering, CpuMetering::Fuel);
    let config = parse("[wasm]\nmetering = \"epoch\"\n[servers.a]\nwasm = \"a.wasm\"\n").unwrap();
    assert_eq!(config.wasm.metering, CpuMetering::Epoch);
    let (line, column, message) = invalid_at("[wasm]\nmetering = \"time\"\n");
    assert_eq!((line, column), (2, 12));
    assert!(
        message.contains("unknown variant `time`, expected `fuel` or `epoch`"),
        "{message}"
    );
}

#[test]
fn a_variable_name_that_cannot_be_one_is_refused_naming_the_server_and_key() {
    let (line, column, message) =
        invalid_at("[servers.a]\nwasm = \"a.wasm\"\nenv_passthrough = [\"OK\", \"A=B\"]\n");
    assert_eq!((line, column), (3, 26));
    assert_eq!(
        message,
        "server `a`: env_passthrough: \"A=B\" is not a variable name: it holds `=` or NUL"
    );
    let (_, _, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\nenv = { \"X=1\" = \"y\" }\n");
    assert_eq!(
        message,
        "server `a`: env: \"X=1\" is not a variable name: it holds `=` or NUL"
    );
    let (_, _, message) = invalid_at(
        "[servers.a]\nurl = \"https://a.example/mcp\"\nsandbox = \"best-effort\"\nbearer_token_env = \"\"\n",
    );
    assert_eq!(
        message,
        "server `a`: bearer_token_env: an empty name is not a variable name"
    );
}

#[test]
fn a_bad_allocator_setting_is_refused_at_its_place() {
    let (line, column, message) = invalid_at("[wasm]\npool_instances = 0\n");
    assert_eq!((line, column), (2, 18));
    assert!(message.contains("nonzero"), "{message}");
    let (_, _, message) = invalid_at("[wasm]\nallocator = \"mmap\"\n");
    assert!(
        message.contains("expected `pooling` or `on-demand`"),
        "{message}"
    );
}

#[test]
fn a_typed_component_gets_an_instance_per_call_unless_session_is_asked_for() {
    let instances = |text: &str| match &parse(text).unwrap().servers["a"].kind {
        ServerKind::Wasm { instances, .. } => *instances,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        instances("[servers.a]\nwasm = \"a.wasm\"\n"),
        Instances::Call
    );
    assert_eq!(
        instances("[servers.a]\nwasm = \"a.wasm\"\ninstance = \"session\"\n"),
        Instances::Session
    );
    let (line, column, message) =
        invalid_at("[servers.a]\nwasm = \"a.wasm\"\ninstance = \"sometimes\"\n");
    assert_eq!((line, column), (3, 12));
    assert!(
        message.contains("unknown variant `sometimes`, expected `call` or `session`"),
        "{message}"
    );
    let (line, _, message) =
        invalid_at("[servers.a]\nurl = \"https://mcp.example.com/mcp\"\ninstance = \"call\"\n");
    assert_eq!(line, 3);
    assert!(
        message.contains("`instance` applies to `wasm` servers only"),
        "{message}"
    );
}

#[test]
fn a_wasm_server_starts_from_a_snapshot_unless_preinit_is_false() {
    let preinit = |text: &str| parse(text).unwrap().servers["a"].preinit();
    assert!(preinit("[servers.a]\nwasm = \"a.wasm\"\n"));
    assert!(preinit("[servers.a]\nwasm = \"a.wasm\"\npreinit = true\n"));
    assert!(!preinit(
        "[servers.a]\nwasm = \"a.wasm\"\npreinit = false\n"
    ));
    let (line, column, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\npreinit = \"no\"\n");
    assert_eq!((line, column), (3, 11));
    assert!(message.contains("expected a boolean"), "{message}");
    for other in [
        "command = \"node\"",
        "url = \"https://mcp.example.com/mcp\"",
    ] {
        let (line, _, message) = invalid_at(&format!("[servers.a]\n{other}\npreinit = false\n"));
        assert_eq!(line, 3, "{other}");
        assert!(
            message.contains("server `a`: `preinit` applies to `wasm` servers only"),
            "{other}: {message}"
        );
    }
}

#[test]
fn http_net_entries_are_wasi_http_grants_for_wasm_and_tcp_for_native() {
    let config = parse(
        "[servers.w]\nwasm = \"w.wasm\"\nnet = [\"https://API.example.com\", \"http://127.0.0.1:8080\", \"10.0.0.1:22\"]\n\
         [servers.n]\ncommand = \"node\"\nnet = [\"https://api.example.com\"]\n",
    )
    .unwrap();
    let w = &config.servers["w"];
    assert_eq!(
        w.http().iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["https://api.example.com:443", "http://127.0.0.1:8080"]
    );
    assert_eq!(
        w.net.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["10.0.0.1:22"]
    );
    let n = &config.servers["n"];
    assert!(n.http().is_empty());
    assert_eq!(
        n.net.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["api.example.com:443"]
    );
    let (line, _, message) =
        invalid_at("[servers.w]\nwasm = \"w.wasm\"\nnet = [\"https://api.example.com/v1\"]\n");
    assert_eq!(line, 3);
    assert!(message.contains("no path, query or user"), "{message}");
}

#[test]
fn unknown_key_is_rejected_with_line_and_column() {
    let (line, column, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\nwasn = \"typo\"\n");
    assert_eq!((line, column), (3, 1));
    assert!(message.contains("unknown field `wasn`"), "{message}");
}

#[test]
fn unknown_limit_and_bad_value_are_rejected_where_they_are() {
    let (line, _, message) =
        invalid_at("[servers.a]\nwasm = \"a.wasm\"\n[servers.a.limits]\nfuel = 3\n");
    assert_eq!(line, 4);
    assert!(message.contains("unknown field `fuel`"), "{message}");
    let (line, column, message) =
        invalid_at("[servers.a]\nwasm = \"a.wasm\"\n[servers.a.limits]\nmemory_bytes = \"lots\"\n");
    assert_eq!((line, column), (4, 16));
    assert!(message.contains("invalid type"), "{message}");
}

#[test]
fn bad_digest_names_server_and_position() {
    let (line, column, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\nsha256 = \"1234\"\n");
    assert_eq!((line, column), (3, 10));
    assert!(message.contains("server `a`: sha256"), "{message}");
}

#[test]
fn a_remote_server_must_not_claim_containment() {
    // sandbox = "required" is the default: a remote server cannot meet it.
    let (line, column, message) =
        invalid_at("[servers.gh]\nurl = \"https://mcp.example.com/mcp\"\n");
    assert_eq!((line, column), (2, 7));
    assert!(
        message.contains(
            "server `gh`: a remote server cannot be contained: no child process exists to sandbox"
        ),
        "{message}"
    );
    let config = parse(
        "[servers.gh]\nurl = \"https://mcp.example.com/mcp\"\nbearer_token_env = \"GH_TOKEN\"\nsandbox = \"best-effort\"\n",
    )
    .unwrap();
    assert_eq!(
        config.servers["gh"].kind,
        ServerKind::Remote {
            url: "https://mcp.example.com/mcp".into(),
            bearer_token_env: Some("GH_TOKEN".into()),
        }
    );
    // What only a local server can have is refused, by name.
    for (key, value) in [
        ("args", "[\"x\"]"),
        ("env", "{ A = \"b\" }"),
        ("net", "[\"example.com:443\"]"),
        ("sha256", &format!("\"{}\"", "0".repeat(64))),
    ] {
        let (_, _, message) = invalid_at(&format!(
            "[servers.gh]\nurl = \"https://mcp.example.com/mcp\"\nsandbox = \"best-effort\"\n{key} = {value}\n"
        ));
        assert!(
            message.contains(&format!(
                "server `gh`: `{key}` applies to servers Moat runs, not to a remote `url`"
            )),
            "{key}: {message}"
        );
    }
    let (_, _, message) = invalid_at(
        "[servers.gh]\nurl = \"http://mcp.example.com/mcp\"\nsandbox = \"best-effort\"\n",
    );
    assert!(message.contains("plain http is allowed to loopback addresses only"));
    let (_, _, message) =
        invalid_at("[servers.gh]\nwasm = \"a.wasm\"\nurl = \"https://mcp.example.com/mcp\"\n");
    assert!(message.contains("set one of `wasm`, `command`, `url` or `node`, not several"));
    let (_, _, message) = invalid_at("[servers.gh]\nwasm = \"a.wasm\"\nbearer_token_env = \"T\"\n");
    assert!(message.contains("`bearer_token_env` applies to remote `url` servers only"));
}

#[test]
fn zero_limit_and_missing_wasm_and_bad_name_are_rejected() {
    let (_, _, message) =
        invalid_at("[servers.a]\nwasm = \"a.wasm\"\n[servers.a.limits]\nrequest_timeout_ms = 0\n");
    assert!(message.contains("request_timeout_ms must be greater than 0"));
    let (line, _, message) = invalid_at("[serve]\nmax_body_bytes = 1024\nmax_sessions = 0\n");
    assert_eq!(line, 3, "{message}");
    assert!(message.contains("nonzero"), "{message}");
    let settings = parse("[serve]\nmax_sessions = 2\n").unwrap().serve;
    assert_eq!(settings.max_sessions.get(), 2);
    assert_eq!(
        settings.task_after_ms, None,
        "no task of Moat's unless asked"
    );
    let settings = parse("[serve]\ntask_after_ms = 250\n").unwrap().serve;
    assert_eq!(settings.task_after_ms.map(NonZeroU64::get), Some(250));
    let (line, _, message) = invalid_at("[serve]\ntask_after_ms = 0\n");
    assert_eq!(line, 2, "{message}");
    assert_eq!(
        settings.header_timeout_ms.get(),
        10_000,
        "the rest keep their defaults"
    );
    assert_eq!(settings.request_timeout_ms.get(), 30_000);
    let settings = parse("[serve]\nrequest_timeout_ms = 500\n").unwrap().serve;
    assert_eq!(settings.request_timeout_ms.get(), 500);
    let (_, _, message) = invalid_at("[servers.a]\nargs = []\n");
    assert!(message.contains(
        "one of `wasm = \"path\"`, `command = \"program\"`, `url = \"https://...\"` or `node = \"NAME\"` is required"
    ));
    let (line, _, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\ncommand = \"node\"\n");
    assert_eq!(line, 2);
    assert!(
        message.contains("set one of `wasm`, `command`, `url` or `node`, not several"),
        "{message}"
    );
    let (_, _, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\nmeasure = [\"x\"]\n");
    assert!(
        message.contains("`cwd` and `measure` apply to native"),
        "{message}"
    );
    let (_, _, message) = invalid_at("[servers.\"a__b\"]\nwasm = \"a.wasm\"\n");
    assert!(message.contains("server name `a__b`"));
    // `a_` (tool `x`) and `a` (tool `_x`) would both expose `a___x`.
    for name in ["a_", "_a"] {
        let (_, _, message) = invalid_at(&format!("[servers.{name}]\nwasm = \"a.wasm\"\n"));
        assert!(
            message.contains(&format!("server name `{name}`"))
                && message.contains("not beginning or ending with `_`"),
            "{message}"
        );
    }
    assert!(valid_server_name("a_b") && valid_server_name("a-"));
}

#[test]
fn native_server_entry_parses() {
    let config = parse(
        r#"
[servers.time]
command = "python3"
args = ["-m", "mcp_server_time", "$(touch X)"]
cwd = "work"
measure = ["venv/lib/site-packages/mcp_server_time"]
allow_unmeasured = true
[servers.time.limits]
cpu_seconds = 5
address_space_bytes = 1073741824
"#,
    )
    .unwrap();
    let server = config.server("time").unwrap();
    assert_eq!(
        server.kind,
        ServerKind::Native {
            command: "python3".into(),
            base_dir: PathBuf::from("/etc/moat"),
            cwd: PathBuf::from("/etc/moat/work"),
            measure: vec![PathBuf::from(
                "/etc/moat/venv/lib/site-packages/mcp_server_time"
            )],
            package: None,
        }
    );
    assert_eq!(server.args[2], "$(touch X)");
    assert_eq!(server.limits.cpu_seconds, 5);
}

#[test]
fn capabilities_parse_and_bad_ones_are_placed() {
    let config = parse(
        r#"
[servers.a]
wasm = "a.wasm"
net = ["127.0.0.1:8080", "[::1]:9", "example.org:443"]
sandbox = "best-effort"
[[servers.a.dirs]]
host = "data"
guest = "/data"
mode = "ro"
"#,
    )
    .unwrap();
    let server = config.server("a").unwrap();
    assert_eq!(server.sandbox, Sandbox::BestEffort);
    assert_eq!(
        server.dirs,
        [DirGrant {
            host: PathBuf::from("/etc/moat/data"),
            guest: "/data".into(),
            mode: DirMode::Ro,
            inode: None,
        }]
    );
    let shown: Vec<String> = server.net.iter().map(|n| n.to_string()).collect();
    assert_eq!(shown, ["127.0.0.1:8080", "[::1]:9", "example.org:443"]);

    let (line, column, message) =
        invalid_at("[servers.a]\nwasm = \"a.wasm\"\nnet = [\"localhost\"]\n");
    assert_eq!((line, column), (3, 8));
    assert!(message.contains("is not host:port"), "{message}");
    let (_, _, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\nnet = [\"h:0\"]\n");
    assert!(message.contains("1-65535"), "{message}");
    let (line, _, message) = invalid_at(
        "[servers.a]\nwasm = \"a.wasm\"\n[[servers.a.dirs]]\nhost = \"d\"\nmode = \"rw\"\n",
    );
    assert_eq!(line, 3, "the [[servers.a.dirs]] entry");
    assert!(message.contains("needs `guest`"), "{message}");
    let (_, _, message) = invalid_at(
        "[servers.a]\nwasm = \"a.wasm\"\n[[servers.a.dirs]]\nhost = \"d\"\nguest = \"/d\"\nmode = \"rwx\"\n",
    );
    assert!(message.contains("unknown variant `rwx`"), "{message}");
    let (_, _, message) = invalid_at("[servers.a]\nwasm = \"a.wasm\"\nsandbox = \"off\"\n");
    assert!(message.contains("unknown variant `off`"), "{message}");
}

#[test]
fn missing_digest_needs_consent() {
    let config = parse(
        "[servers.a]\nwasm = \"a.wasm\"\n[servers.b]\nwasm = \"b.wasm\"\nallow_unmeasured = true\n",
    )
    .unwrap();
    assert_eq!(config.server("a").unwrap().expectation(), None);
    assert_eq!(
        config.server("b").unwrap().expectation(),
        Some(Expectation::Unpinned)
    );
    match config.server("c") {
        Err(ConfigError::UnknownServer { known, .. }) => assert_eq!(known, "a, b"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn environment_is_exact() {
    let mut spec = ServerSpec::wasm("a", "a.wasm");
    spec.env.values.insert("SET".into(), "1".into());
    spec.env.passthrough = vec!["PATH".into(), "MOAT_SURELY_UNSET_VAR".into()];
    let env = spec.env.resolve();
    let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["PATH", "SET"]);
}

#[test]
fn a_server_on_a_node_is_named_by_profile_and_revision_and_sets_nothing_of_its_own() {
    let key = "ab".repeat(32);
    let pin = "cd".repeat(32);
    let revision = "ef".repeat(32);
    let node = format!(
        "[nodes.build]\nurl = \"https://build.internal:7443\"\ncert_sha256 = \"{pin}\"\npublic_key = \"ed25519:{key}\"\ntoken_env = \"BUILD_TOKEN\"\n"
    );
    // The default sandbox, "required", stays: the node enforces it.
    let config = parse(&format!(
        "{node}\n[servers.time]\nnode = \"build\"\nrevision = \"{revision}\"\n"
    ))
    .unwrap();
    let ServerKind::Node {
        node: target,
        profile,
        revision: expected,
    } = &config.servers["time"].kind
    else {
        panic!("{:?}", config.servers["time"].kind);
    };
    assert_eq!(profile, "time", "the profile defaults to the server's name");
    assert_eq!(expected.to_string(), revision);
    assert_eq!(target.url, "https://build.internal:7443");
    assert_eq!(target.public_key, key);
    assert_eq!(target.cert_sha256.to_string(), pin);
    assert_eq!(config.servers["time"].sandbox, Sandbox::Required);

    let server = |extra: &str| {
        format!("{node}\n[servers.time]\nnode = \"build\"\nrevision = \"{revision}\"\n{extra}")
    };
    // What the node's own config decides is refused here, by name.
    for (key, value) in [
        ("args", "[\"x\"]"),
        ("env", "{ A = \"b\" }"),
        ("env_passthrough", "[\"HOME\"]"),
        ("net", "[\"example.com:443\"]"),
        ("cwd", "\"/tmp\""),
        ("sha256", &format!("\"{}\"", "0".repeat(64))),
        ("allow_unmeasured", "true"),
    ] {
        let (_, _, message) = invalid_at(&server(&format!("{key} = {value}\n")));
        assert_eq!(
            message,
            format!(
                "server `time`: `{key}` is the node's to set: a server on a node runs with the grants, limits and command of the node's own config"
            ),
            "{key}"
        );
    }
    let (_, _, message) = invalid_at(&server("command = \"/bin/sh\"\n"));
    assert!(message.contains("not several"), "{message}");

    // The node, its address, its pins and the revision, each checked.
    let (line, _, message) = invalid_at(&format!(
        "{node}\n[servers.time]\nnode = \"gpu\"\nrevision = \"{revision}\"\n"
    ));
    assert_eq!(line, 8, "{message}");
    assert_eq!(
        message,
        "server `time`: node `gpu` is not under [nodes] (named there: build)"
    );
    let (_, _, message) = invalid_at(&format!("{node}\n[servers.time]\nnode = \"build\"\n"));
    assert!(
        message.starts_with("server `time`: a server on a node needs `revision`"),
        "{message}"
    );
    let (_, _, message) = invalid_at("[servers.time]\nprofile = \"time\"\nwasm = \"a.wasm\"\n");
    assert_eq!(
        message,
        "server `time`: `profile` and `revision` apply to a server on a node (`node = \"NAME\"`)"
    );
    for (field, bad, expected) in [
        (
            "url",
            "http://127.0.0.1:7443",
            "a node is reached over https only",
        ),
        (
            "url",
            "https://build.internal:7443/mcp",
            "give the node's address only",
        ),
        (
            "url",
            "https://user:pw@build.internal",
            "carries credentials",
        ),
        ("public_key", "abc", "is not an Ed25519 public key"),
        ("cert_sha256", "abc", "cert_sha256: "),
        ("token_env", "A=B", "token_env: "),
    ] {
        let text = node
            .lines()
            .map(|line| {
                if line.starts_with(&format!("{field} =")) {
                    format!("{field} = \"{bad}\"")
                } else {
                    line.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let (_, _, message) = invalid_at(&text);
        assert!(
            message.starts_with("node `build`: ") && message.contains(expected),
            "{field} = {bad}: {message}"
        );
    }
}
