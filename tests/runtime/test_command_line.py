from eagle3_runtime.command_line import flags
from eagle3_runtime.vllm_server import VLLMServer


def test_flags_keep_order_write_true_bare_and_leave_out_none():
    options = {
        "--port": 8000,
        "--no-enable-prefix-caching": True,
        "--speculative-config": None,
        "--dtype": "bf16",
    }
    assert flags(options) == ["--port", "8000", "--no-enable-prefix-caching", "--dtype", "bf16"]


def test_vllm_server_command_says_speculation_only_when_given(tmp_path):
    plain = VLLMServer("m", log_path=tmp_path / "log", port=8000)
    assert "--speculative-config" not in plain.command
    assert plain.command[plain.command.index("--port") + 1] == "8000"
    drafted = VLLMServer("m", log_path=tmp_path / "log", port=8000, speculative_config={"method": "eagle3"})
    assert drafted.command[drafted.command.index("--speculative-config") + 1] == '{"method": "eagle3"}'
