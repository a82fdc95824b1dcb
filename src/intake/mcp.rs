//! The intake as an MCP server (Model Context Protocol, Streamable HTTP, with the official
//! Rust SDK `rmcp`) at `/mcp`: each `[intake.tools.NAME]` a tool whose arguments are the
//! command's payload plus `idempotency_key`, refused when missing. A call runs the command
//! as a `POST /v1/commands/{type}` does (the same client and its key scope, the same
//! result); a repeat returns the stored result. Stateless: a call may reach any instance.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::handler::server::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, Implementation, InitializeResult, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::Door;
use super::config::IntakeTool;
use super::run::{Posted, Ran};

/// The argument every tool takes: the command's idempotency key.
pub const KEY_ARGUMENT: &str = "idempotency_key";

/// The client a request to `/mcp` was admitted as (set by [`admit`]).
#[derive(Clone)]
struct McpClient(String);

/// The MCP server: the door and the tools it offers.
#[derive(Clone)]
pub struct Tools {
    door: Arc<Door>,
    /// Each tool with the command type it runs.
    offered: Arc<Vec<(Tool, String)>>,
}

/// The `/mcp` service for `tools`, stopped with `stop`.
pub fn service(
    door: Arc<Door>,
    tools: &std::collections::BTreeMap<String, IntakeTool>,
    allowed_hosts: &[String],
    stop: CancellationToken,
) -> StreamableHttpService<Tools, NeverSessionManager> {
    let offered = tools.iter().map(|(name, tool)| (described(name, tool), tool.kind.clone())).collect();
    let server = Tools { door, offered: Arc::new(offered) };
    let mut config = StreamableHttpServerConfig::default().with_allowed_hosts(allowed_hosts.iter().cloned());
    config.legacy_session_mode = false;
    config.json_response = true;
    config.cancellation_token = stop;
    StreamableHttpService::new(move || Ok(server.clone()), Arc::new(NeverSessionManager::default()), config)
}

/// The tool as listed: its schema with `idempotency_key` added as a required string.
fn described(name: &str, tool: &IntakeTool) -> Tool {
    let mut schema: JsonObject = tool.input_schema.clone();
    schema.entry("type").or_insert_with(|| Value::from("object"));
    let properties = schema.entry("properties").or_insert_with(|| json!({}));
    if let Value::Object(properties) = properties {
        properties.insert(
            KEY_ARGUMENT.into(),
            json!({"type": "string", "minLength": 1, "description": "The command's idempotency key: the same on every retry of this step, another for the next (derive it from the task and the step)."}),
        );
    }
    let required = schema.entry("required").or_insert_with(|| json!([]));
    if let Value::Array(required) = required {
        required.push(Value::from(KEY_ARGUMENT));
    }
    Tool::new(name.to_string(), tool.description.clone(), schema)
}

/// Admits a request to `/mcp` by its API key, as the HTTP routes do.
pub async fn admit(State(door): State<Arc<Door>>, mut request: Request, next: Next) -> Response {
    match door.admit(request.headers()) {
        Ok(client) => {
            let client = McpClient(client.to_string());
            request.extensions_mut().insert(client);
            next.run(request).await
        }
        Err(problem) => problem.into_response(),
    }
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("dedupd", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool runs its command once per idempotency_key; a repeat returns the stored result.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.offered.iter().map(|(tool, _)| tool.clone()).collect()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let parts = context.extensions.get::<axum::http::request::Parts>();
        let Some(McpClient(client)) = parts.and_then(|p| p.extensions.get::<McpClient>()).cloned() else {
            return Err(ErrorData::internal_error("the request was not admitted", None));
        };
        let Some((_, kind)) = self.offered.iter().find(|(tool, _)| tool.name == request.name) else {
            return Err(ErrorData::invalid_params(format!("no tool {:?}", request.name), None));
        };
        let mut arguments = request.arguments.unwrap_or_default();
        let key = match arguments.remove(KEY_ARGUMENT) {
            Some(Value::String(key)) if !key.is_empty() => key,
            _ => {
                return Err(ErrorData::invalid_params(
                    format!("{KEY_ARGUMENT} is required: a non-empty string, the same on every retry"),
                    None,
                ));
            }
        };
        let body = Value::Object(arguments).to_string();
        let headers = parts.map(|p| p.headers.clone()).unwrap_or_default();
        let posted = Posted { client: &client, key: &key, kind, body: body.as_bytes(), request: &headers };
        Ok(match self.door.run(posted).await {
            Ok(Ran::Done { result, location }) => of_result(&result, &location),
            Ok(Ran::Accepted { body, .. }) => CallToolResult::structured(body),
            Err(problem) => CallToolResult::structured_error(problem.document()),
        }
        .into())
    }
}

/// A result record as the tool's answer: the stored result on success (`replayed` on a
/// repeat), else an error carrying the problem the HTTP route would answer.
fn of_result(result: &Value, location: &str) -> CallToolResult {
    let outcome = result.get("outcome").and_then(Value::as_str).unwrap_or("");
    let error = result.get("error").and_then(Value::as_str);
    let replayed = result.get("replay").and_then(Value::as_bool).unwrap_or(false);
    let stored = result.get("result").cloned().unwrap_or(Value::Null);
    match (outcome, error) {
        ("succeeded", _) | ("duplicate", None) => {
            CallToolResult::structured(json!({"outcome": "succeeded", "replayed": replayed, "result": stored}))
        }
        _ => CallToolResult::structured_error(json!({
            "outcome": outcome, "replayed": replayed, "error": error, "result": stored, "location": location,
        })),
    }
}
