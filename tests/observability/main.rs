//! `moat serve --http`'s metrics against its audit log: a run of calls
//! across wasm, native and typed servers, with a limit hit and a restart,
//! scraped from `/metrics` and parsed by the Prometheus project's own
//! Python client (`prometheus_client`'s OpenMetrics parser, installed by
//! tests/setup.sh), must count exactly what the audit log records.

#[path = "../common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use moat_test_guests as guests;
use serde_json::{Value, json};

mod metrics;
mod otlp;

type Agent = rmcp::service::RunningService<rmcp::RoleClient, ()>;

async fn agent(url: &str, token: &str) -> Agent {
    use rmcp::ServiceExt;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config =
        rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
            url.to_owned(),
        )
        .auth_header(token.to_owned());
    let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
    ().serve(transport)
        .await
        .expect("an agent session over HTTP")
}

async fn call(agent: &Agent, tool: &str, arguments: Value) -> Result<bool, String> {
    let mut params = rmcp::model::CallToolRequestParams::new(tool.to_owned());
    params.arguments = arguments.as_object().cloned();
    match agent.call_tool(params).await {
        Ok(result) => Ok(result.is_error != Some(true)),
        Err(error) => Err(error.to_string()),
    }
}

/// `/metrics`, parsed by prometheus_client: every sample as
/// `(name, labels, value)`.
fn scrape(address: &str, token: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let parser = r#"
import json, sys, urllib.request
from prometheus_client.openmetrics.parser import text_string_to_metric_families
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + sys.argv[2]})
with urllib.request.urlopen(request) as response:
    assert response.headers["Content-Type"].startswith("application/openmetrics-text"), response.headers["Content-Type"]
    text = response.read().decode()
samples = [[s.name, s.labels, s.value] for family in text_string_to_metric_families(text) for s in family.samples]
json.dump(samples, sys.stdout)
"#;
    let output = Command::new("python3")
        .args(["-c", parser, &format!("http://{address}/metrics"), token])
        .env("PYTHONPATH", root.join("target/py"))
        .output()
        .expect("python3");
    assert!(
        output.status.success(),
        "prometheus_client (run `bash tests/setup.sh`): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice::<Vec<(String, BTreeMap<String, String>, f64)>>(&output.stdout).unwrap()
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}
