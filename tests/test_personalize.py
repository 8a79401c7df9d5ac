"""Personalization methods on a tiny problem: what each one moves, what it keeps exactly, and
the hyperparameter errors a run config gets."""

import math

import pytest
import torch

from ovalp_flwr.core.heads import ova_bce_loss, softmax_loss
from ovalp_flwr.core.model import AdapterHead, LinearProbe
from ovalp_flwr.personalize import (METHODS, HyperparameterError, LocalData, Task,
                                    make_personalizer)
from ovalp_flwr.personalize.base import average
from ovalp_flwr.personalize.hyperparameters import (HYPERPARAMETERS, METHOD_DOCS, METHOD_NAMES,
                                                    own_knobs, parse_hyperparameters)

D, ADAPTER, K, N = 8, 4, 3, 60


def adapter_model(seed: int = 0) -> AdapterHead:
    torch.manual_seed(seed)
    model = AdapterHead(D, ADAPTER, K)
    with torch.no_grad():
        for param in model.parameters():
            torch.nn.init.normal_(param, std=0.5)
    return model


def probe_model(seed: int = 0) -> LinearProbe:
    torch.manual_seed(seed)
    model = LinearProbe(D, K)
    with torch.no_grad():
        for param in model.parameters():
            torch.nn.init.normal_(param, std=0.5)
    return model


def local_data(classes: tuple[int, ...] = tuple(range(K)), seed: int = 1) -> LocalData:
    generator = torch.Generator().manual_seed(seed)
    labels = torch.tensor(classes)[torch.randint(0, len(classes), (N,), generator=generator)]
    centres = torch.randn(K, D, generator=generator)
    features = centres[labels] + 0.5 * torch.randn(N, D, generator=generator)
    return LocalData(features, labels)


def task(loss=ova_bce_loss, seed: int = 2, on_epoch=None) -> Task:
    generator = torch.Generator().manual_seed(seed)
    return Task(loss, generator) if on_epoch is None else Task(loss, generator, on_epoch)


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def same(a, b) -> bool:
    a, b = snapshot(a), snapshot(b)
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def max_change(model, reference) -> float:
    ref = dict(reference.named_parameters())
    return max(float((p - ref[n]).detach().abs().max()) for n, p in model.named_parameters())


def personalize(name: str, model, options=None, loss=ova_bce_loss, data=None, seed: int = 2,
                on_epoch=None):
    method = make_personalizer(name, {"epochs": 3, **(options or {})})
    return method.personalize(model, data or local_data(), task(loss, seed, on_epoch))


@pytest.mark.parametrize("build", [adapter_model, probe_model])
@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_returns_a_new_model_and_keeps_the_global_one(name, build):
    global_model = build()
    before = snapshot(global_model)
    result = personalize(name, global_model, {"epochs": 6})  # lp-ft's lp-epochs=5 fits
    assert result is not global_model
    shared = {p.data_ptr() for p in global_model.parameters()}
    assert not shared & {p.data_ptr() for p in result.parameters()}
    assert all(torch.equal(before[n], p) for n, p in global_model.named_parameters())
    assert not same(result, global_model)  # and it did personalize
    assert all(p.requires_grad for p in result.parameters())


def test_registry_order():
    assert list(METHODS) == ["ft", "lp", "lp-ft", "proximal", "soup", "sparse", "lss",
                             "own-heads"]


def test_the_torch_free_registry_is_the_methods_own():
    """The run config checks names and knobs against personalize.hyperparameters (no torch):
    the same names, in the same order, with each method's own Hyperparameters, and a
    description of what each does."""
    assert METHOD_NAMES == tuple(METHODS) == tuple(METHOD_DOCS)
    for name, cls in METHODS.items():
        assert cls.name == name and cls.Hyperparameters is HYPERPARAMETERS[name]
        assert make_personalizer(name).hp == parse_hyperparameters(name, {})
        for knob in own_knobs(name):
            assert knob.metadata.get("doc"), f"pft.{name}.{knob.name}: no description"


def test_the_package_names_resolve_on_first_use():
    import ovalp_flwr.personalize as package
    from ovalp_flwr.personalize import base, hyperparameters, methods

    home = {"METHODS": methods, "make_personalizer": methods, "LocalData": base,
            "Personalizer": base, "Task": base, "FineTuning": hyperparameters,
            "HyperparameterError": hyperparameters}
    assert sorted(package.__all__) == sorted(home)
    for name, module in home.items():
        assert getattr(package, name) is getattr(module, name)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        package.nope  # noqa: B018


def test_ft_moves_adapter_and_head_lp_only_the_head():
    global_model = adapter_model()
    ft = personalize("ft", global_model)
    lp = personalize("lp", global_model)
    for name in ("adapter.weight", "adapter.bias", "weight", "bias"):
        assert not torch.equal(ft.get_parameter(name), global_model.get_parameter(name))
    for name in ("adapter.weight", "adapter.bias"):
        assert torch.equal(lp.get_parameter(name), global_model.get_parameter(name))
    for name in ("weight", "bias"):
        assert not torch.equal(lp.get_parameter(name), global_model.get_parameter(name))


def test_lp_ft_all_lp_keeps_the_adapter_and_no_lp_is_ft():
    global_model = adapter_model()
    all_lp = personalize("lp-ft", global_model, {"lp-epochs": 3})
    assert torch.equal(all_lp.adapter.weight, global_model.adapter.weight)
    assert torch.equal(all_lp.adapter.bias, global_model.adapter.bias)
    assert not torch.equal(all_lp.weight, global_model.weight)
    assert same(personalize("lp-ft", global_model, {"lp-epochs": 0}),
                personalize("ft", global_model))
    assert not same(personalize("lp-ft", global_model, {"lp-epochs": 1}),
                    personalize("ft", global_model))


def test_lp_ft_reports_one_continuous_curve():
    epochs = []
    personalize("lp-ft", adapter_model(), {"epochs": 5, "lp-epochs": 2},
                on_epoch=lambda epoch, model: epochs.append(epoch))
    assert epochs == [1, 2, 3, 4, 5]


def test_proximal_huge_mu_stays_at_the_global_model_and_zero_mu_is_ft():
    global_model = adapter_model()
    sgd = {"optimizer": "sgd", "learning-rate": 4e-7, "epochs": 20}  # 1 - 2·lr·mu = 0.2: stable
    held = personalize("proximal", global_model, {**sgd, "mu": 1e6})
    free = personalize("ft", global_model, sgd)
    assert max_change(held, global_model) < 1e-6
    assert max_change(free, global_model) > 10 * max_change(held, global_model)
    assert same(personalize("proximal", global_model, {"mu": 0.0}),
                personalize("ft", global_model))


def gradients(model, data, loss=ova_bce_loss) -> torch.Tensor:
    params = list(model.parameters())
    grads = torch.autograd.grad(loss(model(data.features), data.labels), params)
    return torch.cat([g.abs().flatten() for g in grads])


@pytest.mark.parametrize("build", [adapter_model, probe_model])
@pytest.mark.parametrize("share", [0.1, 0.3])
def test_sparse_moves_only_its_share_of_largest_gradient_entries(build, share):
    global_model, data = build(), local_data()
    result = personalize("sparse", global_model, {"share": share}, data=data)
    scores = gradients(global_model, data)
    k = math.ceil(share * len(scores) - 1e-9)
    changed = torch.cat([(p != q).flatten() for p, q in
                         zip(result.parameters(), global_model.parameters())])
    assert 0 < int(changed.sum()) <= k
    assert bool((scores[changed] >= scores.topk(k).values[-1]).all())


def test_soup_is_the_mean_of_its_candidates_and_they_are_ft_at_spread_rates():
    global_model, data = adapter_model(), local_data()
    soup = make_personalizer("soup", {"epochs": 3, "candidates": 3, "lr-spread": 4.0})
    assert soup.learning_rates() == pytest.approx([2.5e-4, 1e-3, 4e-3])
    result = soup.personalize(global_model, data, task())
    candidates = soup.candidates(global_model, data, task())
    for name, param in result.named_parameters():
        mean = sum(c.get_parameter(name) for c in candidates) / 3
        assert torch.allclose(param, mean, atol=1e-6)
    generator_task = task()  # the candidates are FT runs, one after another on one generator
    for lr, candidate in zip(soup.learning_rates(), candidates):
        ft = make_personalizer("ft", {"epochs": 3, "learning-rate": lr})
        assert same(ft.personalize(global_model, data, generator_task), candidate)
    assert not same(candidates[0], candidates[1])
    assert make_personalizer("soup", {"candidates": 1}).learning_rates() == [1e-3]


@pytest.mark.parametrize("name", ["soup", "lss"])
def test_soups_report_only_the_soup_once(name):
    calls = []
    result = personalize(name, adapter_model(), on_epoch=lambda e, m: calls.append((e, m)))
    assert len(calls) == 1 and calls[0][0] == 3 and calls[0][1] is result


def test_average_is_the_exact_mean():
    one, three = LinearProbe(2, 2), LinearProbe(2, 2)
    with torch.no_grad():
        for param in one.parameters():
            param.fill_(1.0)
        for param in three.parameters():
            param.fill_(3.0)
    soup = average([one, three])
    assert all(bool((p == 2.0).all()) for p in soup.parameters())
    weighted = average([one, three], [0.75, 0.25])
    assert all(bool((p == 1.5).all()) for p in weighted.parameters())
    assert all(bool((p == 1.0).all()) for p in one.parameters())


def test_lss_is_the_mean_of_its_ingredients():
    global_model, data = adapter_model(), local_data()
    lss = make_personalizer("lss", {"epochs": 7, "models": 3})
    assert lss.epochs_per_model() == [2, 2, 3]
    result = lss.personalize(global_model, data, task())
    ingredients = lss.ingredients(global_model, data, task())
    assert len(ingredients) == 3 and not same(ingredients[0], ingredients[1])
    for name, param in result.named_parameters():
        mean = sum(m.get_parameter(name) for m in ingredients) / 3
        assert torch.allclose(param, mean, atol=1e-6)


def test_lss_with_one_ingredient_and_no_regularisers_is_ft():
    global_model = adapter_model()
    options = {"models": 1, "affinity": 0.0, "diversity": 0.0}
    assert same(personalize("lss", global_model, options), personalize("ft", global_model))


def test_lss_huge_affinity_stays_near_the_global_model():
    global_model = adapter_model()
    sgd = {"optimizer": "sgd", "learning-rate": 0.01, "epochs": 6}
    held = personalize("lss", global_model, {**sgd, "affinity": 40.0})  # 1 - 2·lr·a = 0.2
    free = personalize("lss", global_model, {**sgd, "affinity": 0.0, "diversity": 0.0})
    assert max_change(held, global_model) < 0.02
    assert max_change(free, global_model) > 5 * max_change(held, global_model)


@pytest.mark.parametrize("loss", [ova_bce_loss, softmax_loss])
@pytest.mark.parametrize("build", [adapter_model, probe_model])
def test_own_heads_moves_only_the_present_classes_heads(build, loss):
    global_model, data = build(), local_data(classes=(0, 2))
    result = personalize("own-heads", global_model, loss=loss, data=data)
    assert torch.equal(result.weight[1], global_model.weight[1])
    assert torch.equal(result.bias[1], global_model.bias[1])
    for k in (0, 2):
        assert not torch.equal(result.weight[k], global_model.weight[k])
        assert not torch.equal(result.bias[k], global_model.bias[k])
    for name, param in result.named_parameters():
        if name.startswith("adapter."):
            assert torch.equal(param, global_model.get_parameter(name))


def test_own_heads_huge_mu_stays_at_the_global_heads_and_moderate_mu_holds_them_nearer():
    global_model, data = adapter_model(), local_data(classes=(0, 2))
    sgd = {"optimizer": "sgd", "learning-rate": 4e-7, "epochs": 20}  # 1 - 2·lr·mu = 0.2: stable
    held = personalize("own-heads", global_model, {**sgd, "mu": 1e6}, data=data)
    free = personalize("own-heads", global_model, {**sgd, "mu": 0.0}, data=data)
    assert max_change(held, global_model) < 1e-6 < max_change(free, global_model)
    near = personalize("own-heads", global_model, {"mu": 1.0}, data=data)
    assert max_change(near, global_model) < max_change(
        personalize("own-heads", global_model, {"mu": 0.0}, data=data), global_model)
    assert torch.equal(near.weight[1], global_model.weight[1])  # still only its classes' rows


@pytest.mark.parametrize("name, options, key, allowed", [
    ("sparse", {"share": 1.5}, "pft.sparse.share=1.5", "(0, 1]"),
    ("sparse", {"share": 0}, "pft.sparse.share=0", "(0, 1]"),
    ("sparse", {"weight-decay": 0.01}, "pft.sparse.weight-decay=0.01", "weight-decay = 0"),
    ("own-heads", {"weight-decay": 0.01}, "pft.own-heads.weight-decay=0.01", "weight-decay = 0"),
    ("soup", {"candidates": 0}, "pft.soup.candidates=0", ">= 1"),
    ("soup", {"lr-spread": 0.5}, "pft.soup.lr-spread=0.5", ">= 1"),
    ("soup", {"lr-spread": "2"}, "pft.soup.lr-spread='2'", "type float"),
    ("lss", {"models": 0}, "pft.lss.models=0", "[1, epochs=15]"),
    ("lss", {"models": 4, "epochs": 3}, "pft.lss.models=4", "[1, epochs=3]"),
    ("lss", {"affinity": -1.0}, "pft.lss.affinity=-1.0", ">= 0"),
    ("lss", {"diversity": 2.0}, "pft.lss.diversity=2.0", "< affinity=1.0"),
    ("lss", {"mu": 1.0}, "pft.lss.mu=1.0", "lss's hyperparameters: epochs"),
])
def test_bad_hyperparameters_name_key_value_and_what_is_allowed(name, options, key, allowed):
    with pytest.raises(HyperparameterError) as error:
        make_personalizer(name, options)
    message = str(error.value)
    assert "\n" not in message
    assert f"{key} is not allowed" in message and allowed in message


def test_good_hyperparameters_parse():
    assert make_personalizer("soup", {"lr-spread": 3}).hp.lr_spread == 3.0
    assert make_personalizer("sparse", {"share": 1}).hp.share == 1.0
    assert make_personalizer("lss", {"affinity": 0.0, "diversity": 0.0}).hp.affinity == 0.0
    assert make_personalizer("own-heads", {"weight-decay": 0.0}).hp.weight_decay == 0.0


def test_unknown_method_is_named():
    with pytest.raises(HyperparameterError) as error:
        make_personalizer("nope")
    assert "personalize='nope'" in str(error.value)
    assert "own-heads" in str(error.value)


# ------------------------------------------------------------------ the server's scoring


def scored_directly(model, global_model, features, labels) -> tuple[int, float]:
    """One model on the rows, the plain way: right predictions, summed feature distance."""
    with torch.no_grad():
        right = int((model(features).argmax(1) == labels).sum())
        distance = float(torch.linalg.vector_norm(
            model.features(features) - global_model.features(features), dim=1).sum())
    return right, distance


@pytest.mark.parametrize("build", [adapter_model, probe_model])
def test_the_server_scores_every_model_as_a_direct_computation_in_any_chunking(build,
                                                                               monkeypatch):
    from ovalp_flwr.core.model import model_to_numpy
    from ovalp_flwr.federation import protocol as p
    from ovalp_flwr.personalize import scoring

    data, global_model = local_data(seed=5), build(0)
    models = {"ft": personalize("ft", global_model), "lp": personalize("lp", global_model),
              "own": personalize("own-heads", global_model, data=local_data((0,))),
              "other": build(3), "global": global_model}
    records = {name: p.to_record(model_to_numpy(m)) for name, m in models.items()}
    scorer = scoring.FeatureScorer(data.features, data.labels, "relu")
    assert scorer.num_test == N
    for chunk in (scoring.CHUNK_ELEMENTS, 1):  # one pass for all, then one model per pass
        monkeypatch.setattr(scoring, "CHUNK_ELEMENTS", chunk)
        scored = scorer.against(p.to_record(model_to_numpy(global_model)))(records)
        for name, model in models.items():
            right, distance = scored_directly(model, global_model, data.features, data.labels)
            assert scored[name][0] == right, name
            assert scored[name][1] == pytest.approx(distance, rel=1e-5, abs=1e-6), name
        # a model that reads the global features is not distorted at all
        assert scored["lp"][1] == scored["own"][1] == scored["global"][1] == 0.0
