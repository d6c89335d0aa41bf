"""Classifiers take sentence pairs as strings, the TransformerLens way, exactly as the data
pipeline tokenises them."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from helpers import assert_float32_close

from mi_core.data import PairDataset, pair_batches
from mi_core.errors import DataError
from mi_core.models import load_model

PREMISES = ["The doctor saw the lawyer .", "A man is sleeping on the sofa in the afternoon ."]
HYPOTHESES = ["The lawyer saw the doctor .", "Nobody sleeps ."]


def _batch(model):
    data = PairDataset(
        name="two", task="mnli", text_a=PREMISES, text_b=HYPOTHESES, labels=[0, 1],
        num_labels=3, label_names=["entailment", "neutral", "contradiction"],
        prediction_map=[0, 1, 2],
    )  # fmt: skip
    return next(iter(pair_batches(data, model.tokenizer, batch_size=2)))


@pytest.fixture(scope="module")
def gpt2_cls(tiny_checkpoints):
    return load_model(tiny_checkpoints["gpt2-cls"], task="mnli")


@pytest.mark.parametrize("which", ["tiny", "gpt2_cls"])
def test_strings_are_tokenised_as_the_data_pipeline_does(which, request):
    model = request.getfixturevalue(which)
    batch = _batch(model)
    tokens = model.to_tokens(PREMISES, HYPOTHESES)
    for key in ("input_ids", "attention_mask", "token_type_ids"):
        assert torch.equal(tokens[key], batch[key]), key
    expected = model(**batch)
    torch.testing.assert_close(model(PREMISES, HYPOTHESES), expected, atol=0, rtol=0)
    assert_float32_close(model(PREMISES[0], HYPOTHESES[0]), expected[:1])  # alone vs batched
    logits, cache = model.run_with_cache(PREMISES, HYPOTHESES)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)  # TL path vs fused
    assert cache["blocks.0.attn.hook_pattern"].shape[-1] == batch["input_ids"].shape[1]


def test_str_tokens_show_the_pair_template(tiny):
    tokens = tiny.to_str_tokens(PREMISES[0], HYPOTHESES[0])
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2 and "doctor" in tokens
    assert len(tiny.to_str_tokens(PREMISES, HYPOTHESES)) == 2
    single = tiny.to_tokens("just one sentence .")
    assert single["token_type_ids"].sum() == 0 and single["input_ids"].shape[0] == 1


def test_a_premise_without_its_hypothesis_is_refused(tiny):
    with pytest.raises(DataError, match="2 premises but 1 hypotheses"):
        tiny(PREMISES, HYPOTHESES[:1])


def test_transformer_lens_helpers_still_work_on_a_decoder_classifier(gpt2_cls):
    ids = gpt2_cls.to_tokens(PREMISES[0])["input_ids"]
    assert gpt2_cls.to_str_tokens(ids[0]) == gpt2_cls.tokenizer.convert_ids_to_tokens(ids[0])
    # TL's own keywords reach TL's to_tokens (its helpers call it so): a tensor, not a dict
    tl_tokens = gpt2_cls.to_tokens(PREMISES[0], prepend_bos=False)
    assert isinstance(tl_tokens, torch.Tensor) and tl_tokens.dim() == 2


def test_decoder_keywords_on_an_encoder_are_one_clear_error(tiny):
    """TL's HookedEncoder takes no prepend_bos and has no to_str_tokens: the calls had failed
    with TL's TypeError and an AttributeError of super()."""
    for call in (lambda: tiny.to_tokens(PREMISES[0], prepend_bos=False),
                 lambda: tiny.to_str_tokens(PREMISES[0], prepend_bos=False)):  # fmt: skip
        with pytest.raises(TypeError, match="does not take prepend_bos"):
            call()
    ids, mask, types = tiny.to_tokens(PREMISES[0], truncate=True)  # TL's encoder keywords: TL's
    assert torch.equal(ids, tiny.to_tokens(PREMISES[0])["input_ids"])


@pytest.fixture(scope="module")
def roberta_cls(tiny_checkpoints):
    return load_model(tiny_checkpoints["roberta-cls"], task="mnli")


@pytest.mark.parametrize("which", ["tiny", "roberta_cls", "gpt2_cls"])
def test_token_ids_alone_get_the_mask_and_token_types_back(which, request):
    model = request.getfixturevalue(which)
    tokens = model.to_tokens(PREMISES, HYPOTHESES)  # two pairs of different lengths: padding
    assert (tokens["attention_mask"] == 0).any()
    mask, types = model.infer_inputs(tokens["input_ids"])
    assert torch.equal(mask, tokens["attention_mask"])
    if which == "tiny":  # BERT: the hypothesis is segment 1
        assert torch.equal(types, tokens["token_type_ids"]) and types.sum() > 0
    torch.testing.assert_close(model(tokens["input_ids"]), model(**tokens), atol=1e-6, rtol=0)
    torch.testing.assert_close(model(tokens), model(**tokens), atol=0, rtol=0)  # the dict itself
    if which == "roberta_cls":  # one token type: none is inferred
        assert types is None


def test_transformer_lens_patching_runs_on_pair_token_ids(tiny):
    """TL's activation patching hands the classifier bare token ids; the result equals the same
    patch run by hand with the tokenizer's mask and token types."""
    from transformer_lens import patching

    clean = tiny.to_tokens(PREMISES, HYPOTHESES)
    corrupt = tiny.to_tokens(HYPOTHESES[:1] * 2, PREMISES[:1] * 2)
    width = min(clean["input_ids"].shape[1], corrupt["input_ids"].shape[1])
    clean = {k: v[:, :width] for k, v in clean.items()}
    corrupt = {k: v[:, :width] for k, v in corrupt.items()}
    _, clean_cache = tiny.run_with_cache(**clean)

    def metric(logits):
        return logits[:, 0].mean()

    patched = patching.get_act_patch_attn_head_out_all_pos(
        tiny, corrupt["input_ids"], clean_cache, metric
    )
    assert patched.shape == (tiny.cfg.n_layers, tiny.cfg.n_heads)

    def hook(z, hook, head=1):
        z[:, :, head] = clean_cache[hook.name][:, :, head]
        return z

    by_hand = tiny.run_with_hooks(**corrupt, fwd_hooks=[("blocks.1.attn.hook_z", hook)])
    assert patched[1, 1].item() == pytest.approx(metric(by_hand).item(), abs=1e-5)
    # without the pair's token types the numbers differ: the inference is what makes it right
    plain = tiny.run_with_hooks(
        corrupt["input_ids"],
        attention_mask=corrupt["attention_mask"],
        token_type_ids=torch.zeros_like(corrupt["input_ids"]),
        fwd_hooks=[("blocks.1.attn.hook_z", hook)],
    )
    assert abs(metric(plain).item() - metric(by_hand).item()) > 1e-6


def test_transformer_lens_head_detector_says_what_to_use_on_a_classifier(tiny):
    from transformer_lens.head_detector import detect_head

    with pytest.raises(AttributeError, match="score_attention_patterns"):
        detect_head(tiny, PREMISES[0], "previous_token_head")
    tokens = tiny.to_tokens(PREMISES, HYPOTHESES)
    moved = tokens.to("cpu")
    assert set(moved) == {"input_ids", "attention_mask", "token_type_ids"}
    assert not hasattr(tokens, "shape")


@pytest.mark.parametrize("which", ["tiny", "gpt2_cls"])
def test_token_ids_turn_back_into_tokens_and_text_as_transformer_lens_does(which, request):
    model = request.getfixturevalue(which)
    tokens = model.to_tokens(PREMISES, HYPOTHESES)
    ids, mask = tokens["input_ids"], tokens["attention_mask"]
    by_hand = [model.tokenizer.convert_ids_to_tokens(row.tolist()) for row in ids]
    assert model.to_str_tokens(ids[1]) == by_hand[1]  # [pos]: one list, pads included
    assert model.to_str_tokens(ids[1:]) == by_hand[1]  # [1, pos], as TL
    assert model.to_str_tokens(ids[1].tolist()) == by_hand[1]  # a list of ints
    assert model.to_str_tokens(ids) == by_hand  # [batch, pos]: a list per row
    assert model.to_str_tokens([ids[0], ids[1]]) == by_hand  # a list of inputs, as TL
    # to_tokens's output: each row without its pads, the same as from the strings
    assert model.to_str_tokens(tokens) == model.to_str_tokens(PREMISES, HYPOTHESES)
    assert len(model.to_str_tokens(tokens)[0]) == int(mask[0].sum())
    text = model.to_string(ids[0, : int(mask[0].sum())])
    assert text == model.tokenizer.decode(ids[0, : int(mask[0].sum())].tolist())
    assert "doctor" in text and model.to_string(ids) == [model.to_string(r) for r in ids]
    word = model.to_single_token("doctor")
    assert model.tokenizer.convert_ids_to_tokens([word]) == ["doctor"]
    with pytest.raises(DataError, match="is 3 tokens, not a single token"):
        model.to_single_token("doctor doctor doctor")


def test_head_activations_are_cached_whole_with_pos_slice_and_remove_batch_dim(tiny):
    """The task head's hooks are [batch, d_model]: TL's pos_slice would cut their batch axis
    and remove_batch_dim failed on them."""
    tokens = tiny.to_tokens(PREMISES, HYPOTHESES)
    _, full = tiny.run_with_cache(**tokens)
    _, last = tiny.run_with_cache(**tokens, pos_slice=-1)
    for name in ("head.hook_in", "head.hook_pooled"):
        assert last[name].shape == (2, tiny.cfg.d_model)
        torch.testing.assert_close(last[name], full[name], atol=0, rtol=0)
    assert last["blocks.0.hook_resid_post"].shape[:2] == (2, 1)  # the rest still sliced
    one = tiny.to_tokens(PREMISES[0], HYPOTHESES[0])
    _, alone = tiny.run_with_cache(**one)
    _, squeezed = tiny.run_with_cache(**one, remove_batch_dim=True)
    for name in squeezed.keys():
        torch.testing.assert_close(squeezed[name], alone[name][0], atol=0, rtol=0)


def test_a_loss_return_type_lets_run_with_cache_take_gradients(tiny):
    tokens = tiny.to_tokens(PREMISES, HYPOTHESES)
    labels = torch.tensor([0, 2])
    logits = tiny(**tokens)
    loss = tiny(**tokens, labels=labels, return_type="loss")
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, labels))
    both = tiny(**tokens, labels=labels, return_type="both")
    torch.testing.assert_close(both[0], logits)
    torch.testing.assert_close(both[1], loss)
    with pytest.raises(ValueError, match="needs the batch's labels"):
        tiny(**tokens, return_type="loss")
    _, cache = tiny.run_with_cache(**tokens, labels=labels, return_type="loss", incl_bwd=True)
    grad = cache["head.hook_pooled_grad"]  # d loss / d pooled = (softmax - onehot) W_out / 2
    probs = logits.softmax(-1) - torch.nn.functional.one_hot(labels, logits.shape[-1])
    torch.testing.assert_close(grad, probs @ tiny.head.out.weight / 2, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("which", ["gpt2_cls", "roberta_cls"])
def test_nonzero_token_types_on_a_model_without_them_warn_once(which, request):
    model = request.getfixturevalue(which)
    model._warned_token_types = False
    ids = model.to_tokens(PREMISES, HYPOTHESES)["input_ids"]
    zeros = torch.zeros_like(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # zeros, or none given: nothing to say
        plain = model(ids, token_type_ids=zeros)
        model(ids)
    ones = torch.ones_like(ids)
    with pytest.warns(UserWarning, match="no token-type embeddings"):
        ignored = model(ids, token_type_ids=ones)
    torch.testing.assert_close(ignored, plain, rtol=0, atol=0)  # ignored, as documented
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model
        model(ids, token_type_ids=ones)


@pytest.mark.parametrize("which", ["tiny", "gpt2_cls"])
def test_means_ablation_tables_and_attention_scores_infer_what_a_batch_lacks(which, request):
    """Ids alone (or ids and a mask) give the numbers the whole batch gives, as ``model(ids)``
    does: means, the fast ablation table and attention scores had counted pads as tokens (and
    typed a BERT pair's hypothesis 0)."""
    from mi_core.analysis import score_attention_patterns
    from mi_core.interventions import ablation_logits, compute_means
    from mi_core.naming import Component

    model = request.getfixturevalue(which)
    data = PairDataset(
        name="pads", task="mnli", text_a=PREMISES * 2, text_b=[HYPOTHESES[1], HYPOTHESES[0]] * 2,
        labels=[0, 1, 2, 0], num_labels=3,
        label_names=["entailment", "neutral", "contradiction"], prediction_map=[0, 1, 2],
    )  # fmt: skip
    whole = list(pair_batches(data, model.tokenizer, batch_size=4))
    assert (whole[0]["attention_mask"] == 0).any()  # the batch has pads
    partial = {
        "ids": [{"input_ids": b["input_ids"]} for b in whole],
        "no types": [
            {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]} for b in whole
        ],  # fmt: skip
    }
    means = compute_means(model, whole)
    heads = [Component(0, 1), Component(1, 0)]
    table = ablation_logits(model, whole, heads, means=means)
    sep = [model.tokenizer.sep_token_id or model.tokenizer.eos_token_id]
    scores = score_attention_patterns(model, whole, sep_ids=sep).to_frame()
    for name, batches in partial.items():
        other = compute_means(model, batches)
        torch.testing.assert_close(other.z, means.z, msg=name)
        torch.testing.assert_close(other.mlp_out, means.mlp_out, msg=name)
        assert ablation_logits(model, batches, heads, means=means).max_abs_diff(table) < 1e-5
        again = score_attention_patterns(model, batches, sep_ids=sep).to_frame()
        assert again.equals(scores), name
    # a lone separator id works as a list of one
    assert score_attention_patterns(model, whole, sep_ids=sep[0]).to_frame().equals(scores)
    # the circuits' mean fill too (it had averaged over pads: 0.61 off on the tiny BERT)
    from mi_core.interventions import Graph, sender_means

    graph = Graph.from_model(model)
    torch.testing.assert_close(
        sender_means(model, graph, partial["ids"]), sender_means(model, graph, whole)
    )


@pytest.mark.parametrize("which", ["tiny", "gpt2_cls"])
def test_one_texts_ids_get_a_batch_dimension_and_mismatched_inputs_are_refused(which, request):
    """TransformerLens adds a batch dimension to 1-D tokens; a mask of another length had given
    the GPT-2 classifier's logits at a wrong position, silently."""
    from mi_core.errors import ModelInputError

    model = request.getfixturevalue(which)
    batch = _batch(model)
    full = model(**batch)
    first = batch["input_ids"][0]
    torch.testing.assert_close(model(first), full[:1], atol=1e-5, rtol=0)
    torch.testing.assert_close(model(first.tolist()), full[:1], atol=1e-5, rtol=0)
    mask = batch["attention_mask"]  # masks as lists, and one text's [1, pos] mask
    torch.testing.assert_close(model(batch["input_ids"], mask.tolist()), full, atol=1e-5, rtol=0)
    torch.testing.assert_close(model(first, mask[:1]), full[:1], atol=1e-5, rtol=0)
    bad = {
        "attention_mask has shape": lambda: model(
            batch["input_ids"], batch["attention_mask"][:, 1:]
        ),
        "more than the model's context": lambda: model(
            torch.full((1, model.cfg.n_ctx + 1), 5, dtype=torch.long)
        ),
        "labels must be class indices 0-2": lambda: model(
            **{**batch, "labels": torch.tensor([0, 5])}, return_type="loss"
        ),
        "labels hold 1 values for a batch of 2": lambda: model(
            **{**batch, "labels": torch.tensor([0])}, return_type="loss"
        ),
        "must be [batch, pos]": lambda: model(torch.zeros(2, 3, 4, dtype=torch.long)),
    }
    for says, call in bad.items():
        with pytest.raises(ModelInputError, match=re.escape(says)):
            call()


@pytest.mark.parametrize("which", ["tiny", "gpt2_cls"])
def test_stop_at_layer_is_refused_with_the_calls_that_give_that_stream(which, request):
    model = request.getfixturevalue(which)
    batch = _batch(model)
    with pytest.raises(TypeError, match=r"stop_at_layer=L\) run model.run_blocks") as info:
        model(**batch, stop_at_layer=1)
    assert "blocks.L.hook_resid_pre" in str(info.value)
    ids, mask, types = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"]
    stream = model.run_blocks(model.embed_input(ids, mask, types), mask, stop=1)
    _, cache = model.run_with_cache(**batch)
    torch.testing.assert_close(stream, cache["blocks.1.hook_resid_pre"], atol=1e-5, rtol=0)


def test_stages_run_by_hand_refuse_more_tokens_than_the_context(tiny_checkpoints):
    """Means and ablation tables run the model's stages themselves and skipped forward's
    context check: a --max-length beyond n_ctx ended in a raw shape error."""
    from mi_core.errors import ModelInputError
    from mi_core.interventions import compute_means
    from mi_core.models.classifier import batch_inputs

    model = load_model(tiny_checkpoints["bert-cls"], task="mnli")
    ids = torch.full((1, model.cfg.n_ctx + 1), 1000)
    with pytest.raises(ModelInputError, match=r"at most \d+"):
        batch_inputs(model, {"input_ids": ids})
    with pytest.raises(ModelInputError, match="more than the model's context"):
        compute_means(model, [{"input_ids": ids}], progress=False)


def test_evaluate_refuses_a_model_with_another_number_of_classes(tmp_path):
    """A 2-class QQP model on MNLI pairs had been scored (argmax mapped through MNLI's labels)
    without a word: 35 % on MNLI, 0 % on SO-Swap."""
    from mi_core.evaluation import evaluate
    from mi_core.testing import make_tiny_checkpoint

    qqp = load_model(make_tiny_checkpoint("bert-cls", tmp_path / "qqp", num_labels=2), task="qqp")
    pairs = PairDataset(
        name="toy", task="mnli", text_a=["a cat sat"] * 3, text_b=["a dog sat"] * 3,
        labels=[0, 1, 2], num_labels=3, label_names=["entailment", "neutral", "contradiction"],
        prediction_map=[0, 1, 2],
    )  # fmt: skip
    with pytest.raises(DataError, match="the model has 2 classes"):
        evaluate(qqp, pairs)
