"""One module per `eagle3 <stage>` command: `add_arguments(parser)` and `run(args) -> StageResult`."""
