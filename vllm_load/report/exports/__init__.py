"""The run in other tools' formats and destinations: vllm bench serve's result, llm-d's Benchmark Report, MLPerf Endpoints' result summary, the CSV, OpenTelemetry, MLflow and W&B."""
