#include "quant/gptq/solve_rows.h"

#include <algorithm>

namespace qlink {
namespace quant {
namespace {

int64_t ElementBytes(const DLTensor& t) { return t.dtype.bits / 8; }

}  // namespace

std::vector<int32_t> GroupIndex(const HessianInverse& inverse, const GptqOptions& options) {
  const int64_t n = inverse.n;
  std::vector<int32_t> g(static_cast<size_t>(n), 0);
  if (options.group_size == -1) return g;
  // Static groups keep the original columns' groups, and so does the group-aware order (it
  // visits each group whole); under act-order a column joins the group of the position it
  // was visited in.
  const bool visited_in_place = options.static_groups || options.act_group_aware || inverse.position.empty();
  for (int64_t j = 0; j < n; ++j) {
    g[j] = static_cast<int32_t>((visited_in_place ? j : inverse.position[j]) / options.group_size);
  }
  return g;
}

Status SolveRows(DeviceBackend& backend, QuantMath& math, const HessianInverse& inverse, const RowsJob& job,
                 const GptqOptions& options, const std::function<bool()>& may_write, Workspace* workspace,
                 std::vector<double>* row_loss) {
  const Layer& layer = *job.layer;
  const int device = job.device;
  const Stream s = job.stream;
  const int64_t rows = job.row_end - job.row_begin, cols = layer.cols, groups = layer.groups;
  const int64_t gs = options.group_size;
  const bool local = device == layer.device;

  // The working weight, columns in visiting order.
  const DLTensor& w = *layer.weight;
  const char* w_rows = DataOf(w) + job.row_begin * cols * ElementBytes(w);
  DeviceBuffer staged;
  if (!local) {
    const uint64_t bytes = rows * cols * ElementBytes(w);
    QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, bytes, &staged));
    const CopyLeaf leaf{w_rows, staged.as<char>(), bytes};
    QLINK_RETURN_IF_ERROR(backend.CopyLeaves(device, layer.device, &leaf, 1, s));
    w_rows = staged.as<char>();
  }
  DeviceBuffer perm, position, column_group, wf, scales, zeros, codes, err, loss;
  QLINK_RETURN_IF_ERROR(Upload(backend, inverse.perm, *workspace, &perm));
  QLINK_RETURN_IF_ERROR(Upload(backend, inverse.position, *workspace, &position));
  const int32_t* p = perm.as<int32_t>();  // both null for the columns in their order
  const int32_t* q = position.as<int32_t>();
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * rows * cols, &wf));
  QLINK_RETURN_IF_ERROR(math.LoadWeight(device, s, w_rows, w.dtype, rows, cols, p, wf.as<float>()));
  staged = DeviceBuffer();

  // Group tables, and each working column's group in them.
  std::vector<int32_t> group_of(static_cast<size_t>(cols), 0);
  if (gs != -1) {
    for (int64_t c = 0; c < cols; ++c) {
      group_of[c] = static_cast<int32_t>((options.static_groups && p != nullptr ? inverse.perm[c] : c) / gs);
    }
  }
  QLINK_RETURN_IF_ERROR(Upload(backend, group_of, *workspace, &column_group));
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * rows * groups, &scales));
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * rows * groups, &zeros));
  auto ranges = [&](int64_t group_size, int64_t first, int64_t count, const int32_t* columns) {
    return math.GroupRanges(device, s, wf.as<float>(), rows, cols, group_size, first, count, columns, options.grid,
                            scales.as<float>(), zeros.as<float>(), groups);
  };
  // GPTQModel takes the whole-row range before zeroing dead columns, static groups after.
  if (gs == -1) QLINK_RETURN_IF_ERROR(ranges(cols, 0, 1, nullptr));
  DeviceBuffer dead;
  QLINK_RETURN_IF_ERROR(Upload(backend, inverse.dead, *workspace, &dead));
  if (!inverse.dead.empty()) {
    QLINK_RETURN_IF_ERROR(math.ZeroColumns(device, s, wf.as<float>(), rows, cols, dead.as<int32_t>(),
                                           static_cast<int64_t>(inverse.dead.size())));
  }
  if (options.static_groups) {
    // Group g is the original columns g * gs + j, found at their working positions.
    QLINK_RETURN_IF_ERROR(ranges(gs, 0, groups, q));
  }

  if (layer.codes != nullptr) QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, rows * cols, &codes));
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(float) * rows * std::min(cols, kBlockColumns), &err));
  QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, sizeof(double) * rows, &loss));
  QLINK_RETURN_IF_ERROR(backend.Memset(device, loss.as<void>(), 0, sizeof(double) * rows, s));
  const float* u = inverse.u.as<float>();
  for (int64_t first = 0; first < cols; first += kBlockColumns) {
    const int64_t count = std::min(kBlockColumns, cols - first), end = first + count;
    if (gs != -1 && !options.static_groups) {
      // Groups starting in this block take their range from the weight as the block starts.
      const int64_t g0 = (first + gs - 1) / gs, g1 = (end - 1) / gs;
      if (g0 <= g1) QLINK_RETURN_IF_ERROR(ranges(gs, g0, g1 - g0 + 1, nullptr));
    }
    BlockArgs b;
    b.w = wf.as<float>();
    b.rows = rows;
    b.ld = cols;
    b.first = first;
    b.count = count;
    b.u = u;
    b.n = cols;
    b.column_group = column_group.as<int32_t>();
    b.scales = scales.as<float>();
    b.zeros = zeros.as<float>();
    b.groups = groups;
    b.grid = options.grid;
    b.codes = codes.as<uint8_t>();
    b.err = err.as<float>();
    b.row_loss = loss.as<double>();
    QLINK_RETURN_IF_ERROR(math.QuantizeBlock(device, s, b));
    if (end < cols) {
      // W[:, end:] -= Err1 @ U[first:end, end:]
      QLINK_RETURN_IF_ERROR(math.Gemm(device, s, rows, cols - end, count, -1.0f, err.as<float>(), count,
                                      u + first * cols + end, cols, 1.0f, wf.as<float>() + end, cols, options.tf32));
    }
  }
  row_loss->assign(static_cast<size_t>(rows), 0.0);
  QLINK_RETURN_IF_ERROR(backend.SynchronizeStream(device, s));
  QLINK_RETURN_IF_ERROR(backend.CopyToHost(device, row_loss->data(), loss.as<double>(), sizeof(double) * rows));
  err = DeviceBuffer();
  if (!may_write()) return Status::Ok();

  // Outputs: written in place on the layer's device, or staged here and copied over.
  std::vector<CopyLeaf> copies;
  std::vector<DeviceBuffer> outbound;
  auto destination = [&](const DLTensor* t, int64_t row_bytes, DeviceBuffer* stage) -> Status {
    char* final_rows = MutableDataOf(*t) + job.row_begin * row_bytes;
    if (local) return Status::Ok();
    QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, rows * row_bytes, stage));
    copies.push_back({stage->as<char>(), final_rows, static_cast<uint64_t>(rows * row_bytes)});
    return Status::Ok();
  };
  auto target = [&](const DLTensor* t, int64_t row_bytes, DeviceBuffer* stage) {
    return local ? MutableDataOf(*t) + job.row_begin * row_bytes : stage->as<char>();
  };
  if (layer.dequantized != nullptr) {
    DeviceBuffer stage;
    const int64_t row_bytes = cols * ElementBytes(*layer.dequantized);
    QLINK_RETURN_IF_ERROR(destination(layer.dequantized, row_bytes, &stage));
    QLINK_RETURN_IF_ERROR(math.StoreWeight(device, s, wf.as<float>(), rows, cols, q, layer.dequantized->dtype,
                                           target(layer.dequantized, row_bytes, &stage)));
    outbound.push_back(std::move(stage));
  }
  if (layer.codes != nullptr) {
    DeviceBuffer stage;
    QLINK_RETURN_IF_ERROR(destination(layer.codes, cols, &stage));
    QLINK_RETURN_IF_ERROR(math.StoreCodes(device, s, codes.as<uint8_t>(), rows, cols, q,
                                          reinterpret_cast<uint8_t*>(target(layer.codes, cols, &stage))));
    outbound.push_back(std::move(stage));
  }
  // The tables hold the groups in visiting order; the group-aware order gives them back in
  // the groups' own order.
  DeviceBuffer group_position;
  QLINK_RETURN_IF_ERROR(Upload(backend, inverse.group_position, *workspace, &group_position));
  for (auto [t, table] : {std::make_pair(layer.scales, &scales), std::make_pair(layer.zeros, &zeros)}) {
    if (t == nullptr) continue;
    const uint64_t bytes = sizeof(float) * rows * groups;
    const char* from = table->as<char>();
    if (!inverse.group_position.empty()) {
      DeviceBuffer ordered;
      QLINK_RETURN_IF_ERROR(DeviceBuffer::Make(*workspace, bytes, &ordered));
      QLINK_RETURN_IF_ERROR(math.StoreWeight(device, s, table->as<float>(), rows, groups, group_position.as<int32_t>(),
                                             DLDataType{kDLFloat, 32, 1}, ordered.as<void>()));
      from = ordered.as<char>();
      outbound.push_back(std::move(ordered));
    }
    copies.push_back({from, MutableDataOf(*t) + job.row_begin * sizeof(float) * groups, bytes});
  }
  QLINK_RETURN_IF_ERROR(backend.SynchronizeStream(device, s));
  if (!copies.empty()) {
    QLINK_RETURN_IF_ERROR(backend.CopyLeaves(layer.device, device, copies.data(), copies.size(), job.out_stream));
    QLINK_RETURN_IF_ERROR(backend.SynchronizeStream(layer.device, job.out_stream));
  }
  return Status::Ok();
}

}  // namespace quant
}  // namespace qlink
