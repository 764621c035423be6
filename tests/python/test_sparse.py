"""Brick tensors of other layouts, equal to the CPU's bit for bit. Sparse, COO and compressed:
creation, moves, printing, products, coalescing, an embedding's sparse gradients with SparseAdam,
torch-geometric's sparse adjacency paths. Nested: jagged tensors through attention, strided ones
made, moved, printed and computed with. Each result is a brick tensor with brick members.
Quantized tensors are refused when made, with a message naming the op."""

import pytest
import torch
import torch.nn.functional as F

from torch_brickdev import profiler as bp

BRICK = torch.device("brick")


def _same_bits(a, b):
    """Equal dtype, shape and bytes (so -0.0 differs from 0.0 and a NaN equals itself)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def _members(t):
    if t.layout == torch.sparse_coo:
        return t._indices(), t._values()
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return t.crow_indices(), t.col_indices(), t.values()
    return t.ccol_indices(), t.row_indices(), t.values()


def assert_brick_equals_cpu(on_brick, on_cpu):
    """`on_brick` is a brick tensor equal to `on_cpu` bit for bit: for a sparse one its layout,
    shape, coalesced flag and every member (each a brick tensor)."""
    assert on_brick.device.type == "brick", on_brick.device
    assert on_brick.layout == on_cpu.layout
    assert on_brick.shape == on_cpu.shape and on_brick.dtype == on_cpu.dtype
    if on_cpu.layout == torch.strided:
        assert _same_bits(on_brick.cpu(), on_cpu)
        return
    if on_cpu.layout == torch.sparse_coo:
        assert on_brick.is_coalesced() == on_cpu.is_coalesced()
        assert (on_brick.sparse_dim(), on_brick.dense_dim()) == (on_cpu.sparse_dim(),
                                                                 on_cpu.dense_dim())
    for brick_member, cpu_member in zip(_members(on_brick), _members(on_cpu), strict=True):
        assert brick_member.device.type == "brick", brick_member.device
        assert _same_bits(brick_member.cpu(), cpu_member)


def _coo(device, *, coalesced=False, dense_dim=0):
    """A 5x6 COO tensor with duplicate and unordered entries (uncoalesced)."""
    indices = torch.tensor([[4, 0, 2, 0, 3, 2, 1], [1, 5, 3, 5, 0, 3, 2]])
    values = torch.linspace(-1.5, 2.25, 7)
    size = (5, 6)
    if dense_dim:
        values = torch.stack([values, values * 3 + 0.1], dim=1)
        size = (5, 6, 2)
    t = torch.sparse_coo_tensor(indices.to(device), values.to(device), size)
    return t.coalesce() if coalesced else t


def _dense(device, rows=6, cols=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g).to(device)


def _sparse_dense_matrix(device):
    x = torch.zeros(5, 6)
    x[0, 1], x[0, 4], x[2, 2], x[3, 0], x[3, 5], x[4, 3] = 1.25, -2.0, 0.5, 3.0, -0.75, 2.5
    return x.to(device)


# ---- COO ----

@pytest.mark.parametrize("dense_dim", [0, 1])
def test_coo_created_on_brick_equals_the_cpu(dense_dim):
    on_brick = _coo(BRICK, dense_dim=dense_dim)
    assert_brick_equals_cpu(on_brick, _coo("cpu", dense_dim=dense_dim))


def test_coo_factory_with_device_argument():
    indices = torch.tensor([[0, 1, 1], [2, 0, 2]])
    values = torch.tensor([3.0, 4.0, 5.0])
    on_brick = torch.sparse_coo_tensor(indices, values, (2, 3), device="brick")
    assert_brick_equals_cpu(on_brick, torch.sparse_coo_tensor(indices, values, (2, 3)))


def test_coo_moves_to_brick_and_back():
    cpu = _coo("cpu")
    on_brick = cpu.to("brick")
    assert_brick_equals_cpu(on_brick, cpu)
    back = on_brick.cpu()
    assert back.device.type == "cpu" and back.layout == torch.sparse_coo
    assert _same_bits(back._indices(), cpu._indices())
    assert _same_bits(back._values(), cpu._values())


def test_coo_members_are_the_arguments_memory():
    """As on the CPU, a COO tensor made from indices and values holds their memory."""
    indices = torch.tensor([[0, 1], [1, 0]], device=BRICK)
    values = torch.tensor([1.0, 2.0], device=BRICK)
    t = torch.sparse_coo_tensor(indices, values, (2, 2))
    assert t._values().data_ptr() == values.data_ptr()
    assert t._indices().data_ptr() == indices.data_ptr()


def _assert_prints_like_the_cpu(on_brick, on_cpu, device_text="device='brick:0', "):
    """`on_brick` prints as `on_cpu` does, with its device (`device_text`) added (the longer
    text may wrap its last line elsewhere)."""
    text = repr(on_brick)
    assert device_text in text
    assert text.replace(device_text, "").split() == repr(on_cpu).split()


def test_coo_prints_like_the_cpu():
    _assert_prints_like_the_cpu(_coo(BRICK), _coo("cpu"))


def test_dense_to_sparse_and_back_on_brick():
    on_brick = _sparse_dense_matrix(BRICK).to_sparse()
    assert_brick_equals_cpu(on_brick, _sparse_dense_matrix("cpu").to_sparse())
    assert_brick_equals_cpu(on_brick.to_dense(), _sparse_dense_matrix("cpu"))


def test_coalesce_equals_the_cpu():
    on_brick = _coo(BRICK).coalesce()
    assert on_brick.is_coalesced()
    assert_brick_equals_cpu(on_brick, _coo("cpu").coalesce())


@pytest.mark.parametrize("coalesced", [False, True])
def test_sparse_mm_equals_the_cpu(coalesced):
    on_brick = torch.sparse.mm(_coo(BRICK, coalesced=coalesced), _dense(BRICK))
    assert_brick_equals_cpu(on_brick, torch.sparse.mm(_coo("cpu", coalesced=coalesced),
                                                      _dense("cpu")))


def test_sparse_times_sparse_equals_the_cpu():
    on_brick = torch.sparse.mm(_coo(BRICK), _coo(BRICK).t())
    assert_brick_equals_cpu(on_brick, torch.sparse.mm(_coo("cpu"), _coo("cpu").t()))


def test_addmm_equals_the_cpu():
    def run(device):
        return torch.addmm(_dense(device, 5, 3, seed=2), _coo(device), _dense(device),
                           beta=0.5, alpha=2.0)

    assert_brick_equals_cpu(run(BRICK), run("cpu"))


def test_sparse_addmm_equals_the_cpu():
    def run(device):
        return torch.sparse.addmm(_dense(device, 5, 3, seed=2), _coo(device), _dense(device))

    assert_brick_equals_cpu(run(BRICK), run("cpu"))


def test_sparse_mm_gradients_equal_the_cpu():
    def run(device):
        sparse = _coo(device, coalesced=True).requires_grad_()
        dense = _dense(device).requires_grad_()
        torch.sparse.mm(sparse, dense).square().sum().backward()
        return sparse.grad, dense.grad

    for on_brick, on_cpu in zip(run(BRICK), run("cpu"), strict=True):
        assert_brick_equals_cpu(on_brick, on_cpu)


def test_in_place_ops_on_sparse_and_dense_with_sparse():
    def run(device):
        s = _coo(device, coalesced=True)
        s.mul_(2.5)
        dense = _dense(device, 5, 6, seed=3)
        dense.add_(s, alpha=-1.5)
        total = s + _coo(device)
        return s, dense, total

    for on_brick, on_cpu in zip(run(BRICK), run("cpu"), strict=True):
        assert_brick_equals_cpu(on_brick, on_cpu)


def test_embedding_sparse_gradients_with_sparse_adam_equal_the_cpu():
    def train(device):
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(10, 4, sparse=True).to(device)
        optimizer = torch.optim.SparseAdam(embedding.parameters(), lr=0.1)
        indices = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]], device=device)
        grads = []
        for _ in range(3):
            optimizer.zero_grad()
            embedding(indices).square().sum().backward()
            grads.append(embedding.weight.grad)
            optimizer.step()
        return embedding.weight.detach(), grads

    brick_weight, brick_grads = train(BRICK)
    cpu_weight, cpu_grads = train("cpu")
    assert_brick_equals_cpu(brick_weight, cpu_weight)
    for on_brick, on_cpu in zip(brick_grads, cpu_grads, strict=True):
        assert on_brick.layout == torch.sparse_coo
        assert_brick_equals_cpu(on_brick, on_cpu)


def test_sparse_ops_are_brick_kernels():
    """A sparse op is a brick op: timed among brick's kernels like any other, and the backing
    device's ops inside its kernel are its work, not calls of their own."""
    s, d = _coo(BRICK), _dense(BRICK)
    torch.sparse.mm(s, d)  # warm

    def work():
        s.coalesce()
        torch.sparse.mm(s, d)

    with bp.profile(ops="kernels") as kernels:
        work()
    kernel_ops = {b.name for b in kernels.report.bricks if b.kind == "op"}
    assert {"aten::_coalesce", "aten::addmm"} <= kernel_ops, sorted(kernel_ops)
    with bp.profile() as dispatcher:
        work()
    paths = {b.path for b in dispatcher.report.paths if b.kind == "op"}
    assert "aten::coalesce/aten::_coalesce" in paths, sorted(paths)
    assert not [p for p in paths if "aten::_coalesce/" in p or "aten::addmm/" in p], sorted(paths)


# ---- compressed layouts ----

@pytest.mark.parametrize("layout", ["csr", "csc"])
def test_compressed_moves_to_brick_prints_and_moves_back(layout):
    cpu = getattr(_sparse_dense_matrix("cpu"), f"to_sparse_{layout}")()
    on_brick = cpu.to("brick")
    assert_brick_equals_cpu(on_brick, cpu)
    _assert_prints_like_the_cpu(on_brick, cpu)
    back = on_brick.cpu()
    assert back.device.type == "cpu" and back.layout == cpu.layout
    for a, b in zip(_members(back), _members(cpu), strict=True):
        assert _same_bits(a, b)


def _blocked(device, layout):
    """A 6x8 matrix of three nonzero 2x2 blocks, as BSR or BSC."""
    x = torch.zeros(6, 8)
    x[0:2, 2:4] = torch.tensor([[1.25, -2.0], [0.5, 3.0]])
    x[2:4, 0:2] = torch.tensor([[-0.75, 2.5], [4.0, -1.5]])
    x[4:6, 6:8] = torch.tensor([[0.25, 0.0], [-3.5, 1.0]])
    return getattr(x.to(device), f"to_sparse_{layout}")((2, 2))


@pytest.mark.parametrize("layout", ["bsr", "bsc"])
def test_blocked_layouts_move_print_and_equal_the_cpu(layout):
    cpu = _blocked("cpu", layout)
    for on_brick in (cpu.to("brick"), _blocked(BRICK, layout)):
        assert_brick_equals_cpu(on_brick, cpu)
        _assert_prints_like_the_cpu(on_brick, cpu)
        assert_brick_equals_cpu(on_brick.to_dense(), cpu.to_dense())
        back = on_brick.cpu()
        assert back.device.type == "cpu" and back.layout == cpu.layout
        for a, b in zip(_members(back), _members(cpu), strict=True):
            assert _same_bits(a, b)


def test_bsr_created_on_brick_and_its_products_equal_the_cpu():
    def run(device):
        crow = torch.tensor([0, 1, 2, 3], device=device)
        col = torch.tensor([1, 0, 3], device=device)
        values = torch.arange(12, dtype=torch.float32, device=device).reshape(3, 2, 2) / 4 - 1
        made = torch.sparse_bsr_tensor(crow, col, values, (6, 8))
        dense = _dense(device, 8, 3)
        return made, made @ dense, torch.addmm(_dense(device, 6, 3, seed=2), made, dense,
                                               beta=0.5)

    for on_brick, on_cpu in zip(run(BRICK), run("cpu"), strict=True):
        assert_brick_equals_cpu(on_brick, on_cpu)


def test_csr_created_on_brick_equals_the_cpu():
    def make(device):
        crow = torch.tensor([0, 2, 3, 3], device=device)
        col = torch.tensor([1, 3, 0], device=device)
        values = torch.tensor([1.5, -2.0, 4.25], device=device)
        return torch.sparse_csr_tensor(crow, col, values, (3, 4))

    assert_brick_equals_cpu(make(BRICK), make("cpu"))
    assert_brick_equals_cpu(_sparse_dense_matrix(BRICK).to_sparse_csr(),
                            _sparse_dense_matrix("cpu").to_sparse_csr())
    assert_brick_equals_cpu(make(BRICK).to_dense(), make("cpu").to_dense())


def test_csr_products_equal_the_cpu():
    def run(device):
        csr = _sparse_dense_matrix(device).to_sparse_csr()
        return (torch.sparse.mm(csr, _dense(device)), csr @ _dense(device),
                torch.addmm(_dense(device, 5, 3, seed=2), csr, _dense(device), alpha=0.5))

    for on_brick, on_cpu in zip(run(BRICK), run("cpu"), strict=True):
        assert_brick_equals_cpu(on_brick, on_cpu)


def test_csr_to_coo_and_back():
    def run(device):
        coo = _sparse_dense_matrix(device).to_sparse_csr().to_sparse_coo()
        return coo, coo.to_sparse_csr()

    for on_brick, on_cpu in zip(run(BRICK), run("cpu"), strict=True):
        assert_brick_equals_cpu(on_brick, on_cpu)


# ---- torch-geometric ----

def _graph(device):
    edge_index = torch.tensor([[0, 1, 1, 2, 3, 4, 4, 0], [1, 0, 2, 1, 4, 3, 0, 4]])
    weight = torch.linspace(0.5, 2.0, edge_index.size(1))
    adj = torch.sparse_coo_tensor(edge_index, weight, (5, 5)).coalesce()
    return adj.to(device), _dense(device, 5, 3, seed=4)


def test_torch_geometric_sparse_adjacency():
    pyg_utils = pytest.importorskip("torch_geometric.utils")
    from torch_geometric.nn import GCNConv

    def run(device):
        adj, x = _graph(device)
        edge_index, edge_weight = pyg_utils.to_edge_index(adj)
        product = pyg_utils.spmm(adj, x)
        product_csr = pyg_utils.spmm(adj.to_sparse_csr(), x)
        torch.manual_seed(0)
        conv = GCNConv(3, 4).to(device)
        return edge_index, edge_weight, product, product_csr, conv(x, adj), conv(x, adj.t())

    for on_brick, on_cpu in zip(run(BRICK), run("cpu"), strict=True):
        assert_brick_equals_cpu(on_brick, on_cpu)


# ---- jagged nested tensors ----

def _jagged(device, seed):
    g = torch.Generator().manual_seed(seed)
    pieces = [torch.randn(n, 2, 8, generator=g) for n in (3, 5, 2)]
    nt = torch.nested.nested_tensor([p.to(device) for p in pieces], layout=torch.jagged)
    return nt.transpose(1, 2)  # (batch, heads, ragged, head dim)


def test_jagged_nested_sdpa_equals_the_cpu():
    def run(device):
        q, k, v = (_jagged(device, seed) for seed in (1, 2, 3))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2)

    on_brick, on_cpu = run(BRICK), run("cpu")
    assert on_brick.is_nested and on_brick.layout == torch.jagged
    assert on_brick.device.type == "brick"
    assert_brick_equals_cpu(on_brick.values(), on_cpu.values())
    assert_brick_equals_cpu(on_brick.offsets(), on_cpu.offsets())


def test_jagged_nested_sdpa_gradients_equal_the_cpu():
    def run(device):
        q, k, v = (_jagged(device, seed).detach().requires_grad_() for seed in (1, 2, 3))
        F.scaled_dot_product_attention(q, k, v).values().square().sum().backward()
        return [t.grad.values() for t in (q, k, v)]

    for on_brick, on_cpu in zip(run(BRICK), run("cpu"), strict=True):
        assert_brick_equals_cpu(on_brick, on_cpu)


# ---- strided nested tensors ----

def _strided_nested(device):
    g = torch.Generator().manual_seed(5)
    return torch.nested.nested_tensor([torch.randn(n, 4, generator=g) for n in (2, 3, 1)],
                                      device=device)


def _assert_nested_equal(on_brick, on_cpu):
    assert on_brick.is_nested and on_brick.layout == on_cpu.layout == torch.strided
    assert on_brick.device.type == "brick"
    brick_pieces, cpu_pieces = on_brick.unbind(), on_cpu.unbind()
    assert len(brick_pieces) == len(cpu_pieces)
    for a, b in zip(brick_pieces, cpu_pieces, strict=True):
        assert_brick_equals_cpu(a, b)


def test_strided_nested_tensor_created_moved_and_printed_like_the_cpu():
    on_brick, on_cpu = _strided_nested(BRICK), _strided_nested("cpu")
    _assert_nested_equal(on_brick, on_cpu)
    _assert_nested_equal(on_cpu.to("brick"), on_cpu)
    back = on_brick.cpu()
    assert back.is_nested and back.device.type == "cpu"
    assert all(_same_bits(a, b) for a, b in zip(back.unbind(), on_cpu.unbind(), strict=True))
    _assert_prints_like_the_cpu(on_brick, on_cpu, device_text=", device='brick:0'")


def test_strided_nested_ops_equal_the_cpu():
    def run(device):
        nt = _strided_nested(device)
        pieces = _strided_nested("cpu").unbind()
        other = torch.nested.as_nested_tensor([p.to(device) for p in pieces])
        scores = torch.matmul(nt, nt.transpose(-1, -2)).softmax(-1)
        nt.mul_(2.0)
        return scores, nt + other, torch.nested.to_padded_tensor(nt, 0.0)

    brick_results, cpu_results = run(BRICK), run("cpu")
    for on_brick, on_cpu in zip(brick_results[:2], cpu_results[:2], strict=True):
        _assert_nested_equal(on_brick, on_cpu)
    assert_brick_equals_cpu(brick_results[2], cpu_results[2])


# ---- refused: quantized tensors ----

QUANTIZED = "quantized tensor .*which brick does not support"


def test_quantize_per_tensor_of_a_brick_tensor_is_refused():
    x = torch.linspace(-1, 1, 8, device=BRICK)
    with pytest.raises(NotImplementedError, match="aten::quantize_per_tensor made a " + QUANTIZED):
        torch.quantize_per_tensor(x, 0.1, 0, torch.qint8)
    with pytest.raises(NotImplementedError, match=QUANTIZED):
        torch.quantize_per_channel(x.reshape(2, 4), torch.tensor([0.1, 0.2], device=BRICK),
                                   torch.tensor([0, 0], device=BRICK), 0, torch.quint8)


def test_quantized_tensor_is_refused_on_brick():
    q = torch.quantize_per_tensor(torch.linspace(-1, 1, 8), 0.1, 0, torch.qint8)
    with pytest.raises(NotImplementedError, match=QUANTIZED):
        q.to("brick")
    with pytest.raises(NotImplementedError, match=QUANTIZED):
        torch._empty_affine_quantized((2, 3), scale=0.1, zero_point=0, dtype=torch.qint8,
                                      device="brick")
