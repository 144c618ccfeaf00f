//! What a fuzz run leaves behind: case files in the corpus (one per
//! finding, replayable with `moat fuzz --replay`), and reports as JSON or
//! JUnit XML for CI systems.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use super::{Case, Class, Finding, FuzzError, PROTOCOL_SUBJECT, Summary};
use crate::config::ServerSpec;

/// The version of the case file format.
pub const CASE_FORMAT: u32 = 1;

/// A saved case: the minimal input of a finding and how it was found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CaseFile {
    pub moat_fuzz_case: u32,
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    pub class: Class,
    #[serde(default)]
    pub detail: String,
    #[serde(default)]
    pub seed: u64,
    pub case: Case,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<Case>,
}

impl CaseFile {
    /// Reads a case file, or a bare case as a corpus may hold (then with no
    /// server, class `ok` and no detail).
    pub fn read(path: &Path) -> Result<Self, FuzzError> {
        let text = std::fs::read_to_string(path).map_err(|e| FuzzError::CaseFile {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
        let file = serde_json::from_str::<Self>(&text).or_else(|file_error| {
            serde_json::from_str::<Case>(&text)
                .map(|case| Self {
                    moat_fuzz_case: CASE_FORMAT,
                    server: String::new(),
                    sha256: None,
                    class: Class::Ok,
                    detail: String::new(),
                    seed: 0,
                    case,
                    original: None,
                })
                .map_err(|_| file_error)
        });
        file.map_err(|e| FuzzError::CaseFile {
            path: path.to_owned(),
            detail: format!(
                "neither a moat fuzz case file nor a case (line {}, column {}): {e}",
                e.line(),
                e.column()
            ),
        })
    }
}

/// Every case in `dir` (`*.json`, recursively, in path order): case files,
/// or bare cases such as `{"kind": "call", "tool": "t", "arguments": {}}`.
/// A missing directory is an empty corpus.
pub fn load_corpus(dir: &Path) -> Result<Vec<Case>, FuzzError> {
    let mut files = Vec::new();
    collect_json(dir, &mut files).map_err(|e| FuzzError::Corpus {
        path: dir.to_owned(),
        detail: e.to_string(),
    })?;
    files.sort();
    let mut cases = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|e| FuzzError::Corpus {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        let case = serde_json::from_str::<CaseFile>(&text)
            .map(|file| file.case)
            .or_else(|_| serde_json::from_str::<Case>(&text))
            .map_err(|e| FuzzError::Corpus {
                path: path.clone(),
                detail: format!("neither a case file nor a case: {e}"),
            })?;
        cases.push(case);
    }
    Ok(cases)
}

fn collect_json(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            collect_json(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
    Ok(())
}

/// Saves `finding` as `corpus/findings/<subject>-<class>-<hash>.json` and
/// returns the path.
pub fn save_finding(
    corpus: &Path,
    spec: &ServerSpec,
    sha256: Option<&str>,
    finding: &Finding,
    seed: u64,
) -> Result<PathBuf, FuzzError> {
    let file = CaseFile {
        moat_fuzz_case: CASE_FORMAT,
        server: spec.name.clone(),
        sha256: sha256.map(str::to_owned),
        class: finding.class,
        detail: if finding.shrink.detail.is_empty() {
            finding.detail.clone()
        } else {
            finding.shrink.detail.clone()
        },
        seed,
        case: finding.case.clone(),
        original: (finding.original != finding.case).then(|| finding.original.clone()),
    };
    let case_json = serde_json::to_vec(&file.case).unwrap_or_default();
    let hash = hex::encode(&sha2::Sha256::digest(&case_json)[..6]);
    let subject = if finding.subject == PROTOCOL_SUBJECT {
        "protocol".to_owned()
    } else {
        file_safe(&finding.subject)
    };
    let dir = corpus.join("findings");
    let path = dir.join(format!("{subject}-{}-{hash}.json", finding.class));
    let mut text = serde_json::to_string_pretty(&file).unwrap_or_default();
    text.push('\n');
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, text))
        .map_err(|source| FuzzError::Write {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}

/// A name safe in a file name: ASCII letters, digits, `-` and `_`.
fn file_safe(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if safe.is_empty() { "tool".into() } else { safe }
}

/// The report as JSON.
pub fn json(summary: &Summary) -> String {
    let mut value = serde_json::to_value(summary).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        map.insert("moat_fuzz_report".into(), serde_json::json!(1));
    }
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

/// The report as JUnit XML: one test case per tool (and one for protocol
/// cases), failing with each of its findings.
pub fn junit(summary: &Summary) -> String {
    let failures = summary.findings.len();
    let seconds = (summary.fuzz_ms + summary.shrink_ms) as f64 / 1000.0;
    let suite = format!("moat fuzz {}", summary.server);
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    out.push_str(&format!(
        "<testsuites name=\"moat fuzz\" tests=\"{}\" failures=\"{failures}\" time=\"{seconds:.3}\">\n",
        summary.subjects.len()
    ));
    out.push_str(&format!(
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"0\" time=\"{seconds:.3}\">\n",
        xml(&suite),
        summary.subjects.len()
    ));
    out.push_str("    <properties>\n");
    for (name, value) in [
        ("launcher", summary.launcher.clone()),
        ("sha256", summary.sha256.clone().unwrap_or_default()),
        ("seed", summary.seed.to_string()),
        ("cases", summary.cases.to_string()),
        (
            "cases_per_second",
            format!("{:.1}", summary.cases_per_second),
        ),
        ("cases_digest", summary.cases_digest.clone()),
    ] {
        out.push_str(&format!(
            "      <property name=\"{name}\" value=\"{}\"/>\n",
            xml(&value)
        ));
    }
    out.push_str("    </properties>\n");
    for (subject, tally) in &summary.subjects {
        let found: Vec<&Finding> = summary
            .findings
            .iter()
            .filter(|f| &f.subject == subject)
            .collect();
        out.push_str(&format!(
            "    <testcase classname=\"{}\" name=\"{}\" assertions=\"{}\"",
            xml(&format!("moat.fuzz.{}", summary.server)),
            xml(subject),
            tally.cases
        ));
        if found.is_empty() {
            out.push_str("/>\n");
            continue;
        }
        out.push_str(">\n");
        for finding in found {
            let case = serde_json::to_string(&finding.case).unwrap_or_default();
            let replay = finding
                .file
                .as_ref()
                .map(|f| format!("\nreplay: moat fuzz --replay {}", f.display()))
                .unwrap_or_default();
            out.push_str(&format!(
                "      <failure type=\"{}\" message=\"{}\">{}</failure>\n",
                finding.class,
                xml(&finding.detail),
                xml(&format!(
                    "{}: {}\nminimal case: {}{replay}",
                    finding.class,
                    finding.detail,
                    excerpt(&case, 2000)
                ))
            ));
        }
        out.push_str("    </testcase>\n");
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

/// At most `max` bytes of `s`, on a char boundary, marked when cut.
pub fn excerpt(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}... ({} bytes)", &s[..cut], s.len())
}

/// Escapes XML text and drops characters XML 1.0 cannot carry.
fn xml(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_text_is_escaped_and_control_characters_dropped() {
        assert_eq!(
            xml("a<b>&\"c'\u{0}\u{1b}[31m\n"),
            "a&lt;b&gt;&amp;&quot;c&apos;[31m\n"
        );
    }

    #[test]
    fn a_bare_case_and_a_case_file_both_load_as_corpus() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("findings")).unwrap();
        std::fs::write(
            dir.path().join("a.json"),
            r#"{"kind": "call", "tool": "echo", "arguments": {"text": "x"}}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("findings/b.json"),
            r#"{"moat_fuzz_case": 1, "server": "s", "class": "panic", "case": {"kind": "unknown-method", "method": "x"}}"#,
        )
        .unwrap();
        let cases = load_corpus(dir.path()).unwrap();
        assert_eq!(cases.len(), 2);
        assert_eq!(cases[0].subject(), "echo");
        assert_eq!(cases[1].kind(), "unknown-method");
        std::fs::write(dir.path().join("c.json"), "{not json").unwrap();
        let error = load_corpus(dir.path()).unwrap_err().to_string();
        assert!(
            error.contains("c.json") && error.contains("neither a case file nor a case"),
            "{error}"
        );
        assert!(load_corpus(&dir.path().join("missing")).unwrap().is_empty());
    }
}
