"""Serve the bundled marketing tools over MCP (stdio by default, or streamable HTTP).

    python -m hat_jax.livestream.serve_marketing --world data/livestream
    python -m hat_jax.livestream.serve_marketing --world data/livestream --transport streamable-http --port 8765

A module of its own (not imported by the package) so `python -m` runs it exactly once.
"""

import argparse

from hat_jax.livestream import marketing_server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the bundled marketing tools over MCP.")
    parser.add_argument(
        "--world", required=True, help="World folder (catalog.json, marketing.json, ...)."
    )
    parser.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    server = marketing_server(args.world)
    if args.transport == "stdio":
        server.run()
    else:
        server.run(transport="streamable-http", host=args.host, port=args.port)


if __name__ == "__main__":
    main()
