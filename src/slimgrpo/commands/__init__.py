"""The subcommands, above the library: ``slimgrpo train`` and the parser (cli), plan, eval, report, export,
demo and demo_tools. Nothing but a command imports them."""
