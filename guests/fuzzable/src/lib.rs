//! `fuzzable`: a small rmcp server that `moat fuzz` is tested against. Its
//! four tools take a string, an integer, a recursive nested array and an
//! enum, and `classify` declares an outputSchema.
//!
//! Built clean, no input may crash it, hang it, exhaust a limit or make it
//! answer outside its own outputSchema: bad input gets a tool error or
//! invalid params. Each feature plants one bug the fuzzer must find:
//!
//! - `panic-on-long-string`: `echo` panics on text longer than 4096 bytes;
//! - `loop-on-negative`: `countdown` loops forever on a negative integer;
//! - `alloc-on-nested`: `flatten` allocates without bound when an item is
//!   itself an array;
//! - `bad-enum-output`: `classify` answers `large` with a `rank` that is a
//!   string, outside its own outputSchema.
//!
//! The same source builds for wasm32-wasip2 and natively.

use std::sync::Arc;

use rmcp::{
    ServerHandler, ServiceExt,
    handler::server::{router::tool::ToolRouter, wrapper::Parameters},
    model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig},
    tool, tool_handler, tool_router,
};
use schemars::JsonSchema;
use serde::Deserialize;

/// The longest `echo` text the planted bug leaves alone.
pub const ECHO_BUFFER_BYTES: usize = 4096;

/// How deep `flatten` follows nested arrays before refusing.
const MAX_NESTING: usize = 64;

#[derive(Deserialize, JsonSchema)]
struct EchoArgs {
    /// Text to send back.
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct CountdownArgs {
    /// Where to count down from; must not be negative.
    from: i64,
}

/// An integer, or an array of items.
#[derive(Deserialize, JsonSchema)]
#[serde(untagged)]
enum Item {
    Number(i64),
    List(Vec<Item>),
}

#[derive(Deserialize, JsonSchema)]
struct FlattenArgs {
    /// Integers, possibly in nested arrays.
    items: Vec<Item>,
}

#[derive(Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Size {
    Small,
    Medium,
    Large,
}

#[derive(Deserialize, JsonSchema)]
struct ClassifyArgs {
    size: Size,
}

#[derive(Clone)]
struct Fuzzable {
    tool_router: ToolRouter<Self>,
}

#[tool_router]
impl Fuzzable {
    fn new() -> Self {
        let mut tool_router = Self::tool_router();
        if let Some(classify) = tool_router.map.get_mut("classify")
            && let serde_json::Value::Object(schema) = serde_json::json!({
                "type": "object",
                "properties": {
                    "size": {"type": "string", "enum": ["small", "medium", "large"]},
                    "rank": {"type": "integer", "minimum": 1, "maximum": 3}
                },
                "required": ["size", "rank"],
                "additionalProperties": false
            })
        {
            classify.attr.output_schema = Some(Arc::new(schema));
        }
        Self { tool_router }
    }

    #[tool(description = "Returns its text unchanged")]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        #[cfg(feature = "panic-on-long-string")]
        if args.text.len() > ECHO_BUFFER_BYTES {
            panic!(
                "echo: {} bytes do not fit the {ECHO_BUFFER_BYTES}-byte buffer",
                args.text.len()
            );
        }
        args.text
    }

    #[tool(description = "Counts down from a non-negative integer, answering the last ten steps")]
    async fn countdown(&self, Parameters(args): Parameters<CountdownArgs>) -> CallToolResult {
        #[cfg(feature = "loop-on-negative")]
        if args.from < 0 {
            // The planted bug: the sign is never checked, so the count goes
            // the long way round.
            let mut n = args.from;
            while n != 0 {
                n = std::hint::black_box(n.wrapping_sub(1));
            }
        }
        if args.from < 0 {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "from must not be negative, got {}",
                args.from
            ))]);
        }
        let steps: Vec<String> = (0..=args.from)
            .rev()
            .take(10)
            .map(|n| n.to_string())
            .collect();
        CallToolResult::success(vec![ContentBlock::text(steps.join(" "))])
    }

    #[tool(description = "Sums integers given in nested arrays")]
    async fn flatten(&self, Parameters(args): Parameters<FlattenArgs>) -> CallToolResult {
        #[cfg(feature = "alloc-on-nested")]
        if args.items.iter().any(|item| matches!(item, Item::List(_))) {
            // The planted bug: a nested array sends the buffer growing for ever.
            let mut hog: Vec<Vec<u8>> = Vec::new();
            loop {
                hog.push(vec![0xA5; 1 << 20]);
                std::hint::black_box(&hog);
            }
        }
        fn sum(items: &[Item], depth: usize, total: &mut i128, count: &mut u64) -> bool {
            if depth > MAX_NESTING {
                return false;
            }
            for item in items {
                match item {
                    Item::Number(n) => {
                        *total += i128::from(*n);
                        *count += 1;
                    }
                    Item::List(list) => {
                        if !sum(list, depth + 1, total, count) {
                            return false;
                        }
                    }
                }
            }
            true
        }
        let (mut total, mut count) = (0i128, 0u64);
        if !sum(&args.items, 0, &mut total, &mut count) {
            return CallToolResult::error(vec![ContentBlock::text(format!(
                "items nest deeper than {MAX_NESTING} arrays"
            ))]);
        }
        CallToolResult::success(vec![ContentBlock::text(format!(
            "{count} integers, sum {total}"
        ))])
    }

    #[tool(description = "Ranks a size: small 1, medium 2, large 3 (structured output)")]
    async fn classify(&self, Parameters(args): Parameters<ClassifyArgs>) -> CallToolResult {
        let (size, rank) = match args.size {
            Size::Small => ("small", serde_json::json!(1)),
            Size::Medium => ("medium", serde_json::json!(2)),
            #[cfg(feature = "bad-enum-output")]
            Size::Large => ("large", serde_json::json!("3")),
            #[cfg(not(feature = "bad-enum-output"))]
            Size::Large => ("large", serde_json::json!(3)),
        };
        let structured = serde_json::json!({ "size": size, "rank": rank });
        let mut result = CallToolResult::success(vec![ContentBlock::text(structured.to_string())]);
        result.structured_content = Some(structured);
        result
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Fuzzable {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// Serves MCP on stdio until the client hangs up.
pub fn run() -> std::io::Result<()> {
    moat_wit::block_on(async {
        let service = Fuzzable::new()
            .serve(moat_wit::stdio())
            .await
            .map_err(std::io::Error::other)?;
        service.waiting().await.map_err(std::io::Error::other)?;
        Ok(())
    })
}
