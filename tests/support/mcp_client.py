"""A real MCP client (the Python `mcp` package) for tests/intake/intake_mcp.rs: connects to
dedupd's intake at URL over Streamable HTTP with an API key, and runs the calls given as
JSON on stdin ([{"tool": NAME, "arguments": {...}}, ...]); prints one JSON line with the
tools listed and, per call, its structured content, whether it is an error, or the
protocol error it raised.

Usage: python3 mcp_client.py URL API_KEY < calls.json
"""
import asyncio
import json
import sys

from mcp import ClientSession
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError


async def main(url: str, api_key: str, calls: list) -> dict:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {api_key}"})
    async with http, streamable_http_client(url, http_client=http) as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
            tools = [{"name": t.name, "input_schema": t.input_schema} for t in listed.tools]
            answers = []
            for call in calls:
                try:
                    result = await session.call_tool(call["tool"], call["arguments"])
                    answers.append({"structured": result.structured_content, "is_error": bool(result.is_error)})
                except MCPError as e:
                    answers.append({"protocol_error": str(e)})
            return {"tools": tools, "answers": answers}


if __name__ == "__main__":
    out = asyncio.run(asyncio.wait_for(main(sys.argv[1], sys.argv[2], json.load(sys.stdin)), timeout=120))
    print(json.dumps(out))
