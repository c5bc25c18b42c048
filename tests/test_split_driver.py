"""The split-learning driver (``fedhet.algorithms.split_driver``) against plain computations.

* Local links (guests' bottom models in this process, any architectures, several guests) equal
  joint backprop of the whole network with one Adam, written out here.
* Clear links between in-memory parties compute exactly what local links compute.
* The plain interactive layer's forward and backward are A W, G W^T and W - lr A^T G.
* Schedules: batch budget, skipped evaluation; links reject malformed messages with the kind named.
"""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from fedhet.algorithms import split_driver as SD
from fedhet.algorithms.toolkit import HostRows, epoch_permutation, mlp, seeded
from fedhet.parties.api import PeerFault
from fedhet.parties.inmemory import FederationFailed, run_inmemory

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

KINDS = SD.SplitKinds("t/batch", "t/act", "t/grad")
GUEST_DIMS, WIDTHS, HOST_DIM = (4, 5), (3, 2), 3
LR, BS = 0.02, 16




def _toy(n_classes=3, n=90, seed=0):
    """Host rows (train/test) and each guest's common rows; the host's rows sit at shuffled
    positions of the common list, so the positions matter."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, n_classes, n)
    centres = rng.normal(0, 2, (n_classes, HOST_DIM + sum(GUEST_DIMS)))
    x = (centres[y] + rng.normal(0, 1, (n, centres.shape[1]))).astype(np.float32)
    pos = rng.permutation(n)  # host row i is common row pos[i]
    xg, off = [], HOST_DIM
    for d in GUEST_DIMS:
        g = np.empty((n, d), dtype=np.float32)
        g[pos] = x[:, off:off + d]
        xg.append(g)
        off += d
    tr = 70
    rows = HostRows(x[:tr, :HOST_DIM], y[:tr], pos[:tr], x[tr:, :HOST_DIM], y[tr:], pos[tr:], n, 0)
    return rows, xg


def _guest_net(i):
    with seeded(100 + i):  # a different architecture per guest
        return mlp(GUEST_DIMS[i], WIDTHS[i], 2.0, i + 1, "tanh")


def _host_net(n_classes):
    with seeded(7):
        return mlp(HOST_DIM + sum(WIDTHS), 1 if n_classes == 2 else n_classes, 2.0, 1)


def _host_part(net):
    return SD.HostPart(net, lambda xb, zs: net(torch.cat([xb, *zs], dim=1)),
                       [torch.optim.Adam(net.parameters(), lr=LR)])


def _bottom(i, x):
    net = _guest_net(i)
    return SD.GuestBottom(net, x, torch.optim.Adam(net.parameters(), lr=LR))


def _local_run(n_classes, epochs=3, **sched):
    rows, xg = _toy(n_classes)
    net = _host_net(n_classes)
    bottoms = [_bottom(i, x) for i, x in enumerate(xg)]
    res = SD.train_host(_host_part(net), [SD.LocalLink(b) for b in bottoms], rows, n_classes,
                        SD.Schedule(epochs, BS, order_key=[5, 1], **sched))
    return res, net, [b.model for b in bottoms]


def _joint_by_hand(n_classes, epochs=3):
    """One network, one Adam, plain autograd."""
    rows, xg = _toy(n_classes)
    host, guests = _host_net(n_classes), [_guest_net(i) for i in range(len(xg))]
    params = [p for m in guests + [host] for p in m.parameters()]
    opt = torch.optim.Adam(params, lr=LR)
    xh, xs = torch.as_tensor(rows.x_train), [torch.as_tensor(x) for x in xg]
    y = torch.as_tensor(rows.y_train)
    losses = []
    for ep in range(epochs):
        perm = epoch_permutation([5, 1], ep, len(y))
        batch = []
        for s in range(0, len(perm), BS):
            idx = perm[s:s + BS]
            p = torch.as_tensor(rows.pos_train[idx])
            out = host(torch.cat([xh[idx]] + [g(x[p]) for g, x in zip(guests, xs)], 1))
            if n_classes == 2:
                loss = torch.nn.functional.binary_cross_entropy_with_logits(out.squeeze(1), y[idx].float())
            else:
                loss = torch.nn.functional.cross_entropy(out, y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            batch.append(float(loss.detach()))
        losses.append(float(np.mean(batch)))
    with torch.no_grad():
        p = torch.as_tensor(rows.pos_test)
        out = host(torch.cat([torch.as_tensor(rows.x_test)] + [g(x[p]) for g, x in zip(guests, xs)], 1))
    pred = (out.squeeze(1) > 0).long() if n_classes == 2 else out.argmax(1)
    return losses, float((pred.numpy() == rows.y_test).mean()), host, guests


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


@pytest.mark.parametrize("n_classes", [2, 3])
def test_local_links_equal_joint_backprop(n_classes):
    res, net, guests = _local_run(n_classes)
    losses, acc, ref_host, ref_guests = _joint_by_hand(n_classes)
    assert res["losses"] == losses and res["test_accuracy"] == acc
    assert _same(net, ref_host) and all(_same(g, r) for g, r in zip(guests, ref_guests))
    assert res["batches"] == 3 * 5 and res["batches_per_epoch"] == 5 and res["epochs"] == 3
    assert not res["s_per_epoch_extrapolated"] and len(res["row_losses"]) == 3
    assert losses[-1] < losses[0]


def test_budget_and_no_evaluation():
    res, _, _ = _local_run(3, epochs=4, max_batches=7, evaluate=False)
    assert res["batches"] == 7 and res["epochs"] == pytest.approx(7 / 5) and res["s_per_epoch_extrapolated"]
    assert res["test_accuracy"] is None and len(res["losses"]) == 2
    full, _, _ = _local_run(3, epochs=2)
    assert res["losses"][0] == full["losses"][0]  # the first epoch is the same as without a budget
    with pytest.raises(ValueError, match="round_per"):
        SD.Schedule(1, 8, 0, round_per="step")
    with pytest.raises(ValueError, match="max_batches"):
        SD.Schedule(1, 8, 0, max_batches=0)


def _clear_module(n_classes, bad_guest=False):
    rows, xg = _toy(n_classes)

    def host(party, cfg, data):
        guests = party.peers_with_role("guest")
        net = _host_net(n_classes)
        links = [SD.ClearHostLink(party, g, KINDS, WIDTHS[i], name="test") for i, g in enumerate(guests)]
        res = SD.train_host(_host_part(net), links, rows, n_classes, SD.Schedule(3, BS, [5, 1]), party)
        for ln in links:
            ln.stop()
        return {"res": res, "net": net}

    def guest(party, cfg, data):
        i = int(party.name[-1]) - 1
        b = _bottom(i, xg[i])
        link = SD.ClearGuestLink(party, "host", KINDS, b.n_rows, 4 if bad_guest else BS)
        return {**SD.serve_guest(b, link), "net": b.model}

    return types.SimpleNamespace(NAME="split-test", ROLES={"host": host, "guest": guest}, load_data=None)  # declares nothing: parties accept any kind


@pytest.mark.federation
def test_clear_links_between_parties_equal_local_links():
    mod = _clear_module(3)
    out = run_inmemory(mod, [("host", "host"), ("g1", "guest"), ("g2", "guest")],
                       data={"host": None, "g1": None, "g2": None})
    local, net, guests = _local_run(3)
    res = out["host"]["res"]
    assert res["losses"] == local["losses"] and res["test_accuracy"] == local["test_accuracy"]
    assert _same(out["host"]["net"], net)
    for i, g in enumerate(("g1", "g2")):
        assert _same(out[g]["net"], guests[i])
        assert out[g]["train_batches"] == 15 and out[g]["eval_batches"] == 2 and out[g]["rows_trained_on"] == 70
    assert res["train_bytes"]["sent"] > 0


@pytest.mark.federation
def test_guest_link_rejects_a_batch_it_was_not_told_about():
    mod = _clear_module(3, bad_guest=True)  # guests accept at most 4 rows, the host sends 16
    with pytest.raises(FederationFailed, match="t/batch"):
        run_inmemory(mod, [("host", "host"), ("g1", "guest"), ("g2", "guest")],
                     data={"host": None, "g1": None, "g2": None}, timeout=20)


def test_host_link_rejects_wrong_activation_shape():
    class FakeParty:
        def recv(self, frm, kind, timeout=None):
            return {"a": np.zeros((3, 5), dtype=np.float32)}

        def send(self, to, kind, payload):
            pass

    ln = SD.ClearHostLink(FakeParty(), "g1", KINDS, width=2, name="test")
    ln.begin(np.arange(3), True, 0)
    with pytest.raises(PeerFault, match=r"'test' rejected a 't/act' message from 'g1': must be float32 \(3, 2\)") as e:
        ln.finish_forward()
    assert e.value.peer == "g1"   # the sender is named, never the receiver


def test_plain_linear_layer_by_hand():
    rng = np.random.default_rng(2)
    A = torch.as_tensor(rng.normal(size=(6, 4)), dtype=torch.float32)
    W0 = rng.normal(size=(4, 3))
    G = torch.as_tensor(rng.normal(size=(6, 3)), dtype=torch.float32)
    layer = SD.PlainLinearLayer(W0, lr=0.1)
    np.testing.assert_allclose(layer.forward(A), A.double().numpy() @ W0, rtol=1e-12)
    g_in = layer.backward(G)
    np.testing.assert_allclose(g_in, G.double().numpy() @ W0.T, rtol=1e-12)
    np.testing.assert_allclose(layer.W, W0 - 0.1 * A.double().numpy().T @ G.double().numpy(), rtol=1e-12)
    # the same as a bias-free Linear trained by SGD on the mean loss
    lin = torch.nn.Linear(4, 3, bias=False).double()
    with torch.no_grad():
        lin.weight.copy_(torch.as_tensor(W0.T))
    a = A.double().requires_grad_(True)
    (lin(a) * G.double()).sum().backward()
    torch.optim.SGD(lin.parameters(), lr=0.1).step()
    np.testing.assert_allclose(layer.W, lin.weight.detach().numpy().T, rtol=1e-12)
    np.testing.assert_allclose(g_in, a.grad.numpy(), rtol=1e-12)


def test_guest_bottom_needs_a_training_forward():
    b = _bottom(0, np.zeros((3, GUEST_DIMS[0]), dtype=np.float32))
    b.forward(np.array([0, 2]), train=False)
    with pytest.raises(RuntimeError, match="training forward"):
        b.backward(np.zeros((2, WIDTHS[0])))
