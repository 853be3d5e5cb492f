// Checkpoint files and trained-model export (see checkpoint.h for the formats).
#include "train/checkpoint.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <system_error>

#include "graph/atomic_file.h"
#include "graph/checked.h"
#include "graph/crc32c.h"
#include "graph/error.h"
#include "graph/json_reader.h"
#include "graph/task_graph.h"
#include "importer/constant_params.h"
#include "importer/model_proto.h"
#include "runtime/half_precision.h"

namespace apart {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'A', 'P', 'A', 'R', 'T', 'C', 'K', 'P'};
// 2: the u32 after the version is the header's CRC-32C and each tensor has its "crc32c"; 1 (read, not written): no
// checksums, a 0 there.
constexpr uint32_t kVersion = 2;
constexpr int64_t kAlign = 64;

int64_t align_up(int64_t n, int64_t a) { return (n + a - 1) / a * a; }

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Zeros from the file's current end up to `offset` (tensors start at aligned offsets).
void pad_to(AtomicFile& file, int64_t offset) {
  static const char zeros[4096] = {};
  int64_t pos = static_cast<int64_t>(file.stream().tellp());
  while (pos < offset) {
    const int64_t n = std::min<int64_t>(offset - pos, sizeof zeros);
    file.write(zeros, n);
    pos += n;
  }
}

// Every byte of a checksummed file no tensor covers is padding, written as zeros: the bytes from the header's end to
// the data, and from each tensor's end to the next 64-aligned offset (the last one's included). A byte flipped there,
// or bytes past that end, are damage too, so nothing in the file goes unchecked.
void check_padding(const std::string& bytes, int64_t header_end, int64_t data_start,
                   std::vector<std::pair<int64_t, int64_t>> covered, const std::string& where) {
  auto zeros = [&](int64_t from, int64_t to, const std::string& what) {
    for (int64_t i = from; i < to && i < static_cast<int64_t>(bytes.size()); ++i)
      if (bytes[static_cast<size_t>(i)] != 0)
        throw CorruptData(where + " is damaged: byte " + std::to_string(i) + " (padding " + what +
                          ") is not zero; nothing of it was loaded: resume from another checkpoint");
  };
  zeros(header_end, data_start, "after the header");
  std::sort(covered.begin(), covered.end());
  int64_t end = data_start;
  for (const auto& [offset, nbytes] : covered) {
    zeros(end, data_start + offset, "between tensors");
    end = std::max(end, align_up(data_start + offset + nbytes, kAlign));
    zeros(data_start + offset + nbytes, end, "after a tensor");
  }
  if (static_cast<int64_t>(bytes.size()) != end)
    throw CorruptData(where + " is damaged: it is " + std::to_string(bytes.size()) + " bytes, its header describes " +
                      std::to_string(end) + "; nothing of it was loaded: resume from another checkpoint");
}

std::string read_file_bytes(const fs::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(std::string(what) + " " + path.string() + " cannot be opened: " + std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return bytes;
}

}  // namespace

void write_checkpoint(const fs::path& dir, int64_t step, const nlohmann::json& meta,
                      const std::vector<std::pair<std::string, const Tensor*>>& tensors, Backend& backend) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw SystemError("cannot create checkpoint directory " + dir.string() + ": " + ec.message());
  write_checkpoint_file(dir / kCheckpointFile, step, meta, tensors, backend);
}

void write_checkpoint_file(const fs::path& path, int64_t step, const nlohmann::json& meta,
                           const std::vector<std::pair<std::string, const Tensor*>>& tensors, Backend& backend) {
  // Each tensor's CRC-32C goes into the header, which comes first: one pass over the tensors for them (on the CPU
  // backend to_host shares the memory), then one writing them.
  nlohmann::json header = {{"format", "apart.checkpoint/1"}, {"step", step}, {"meta", meta}};
  nlohmann::json list = nlohmann::json::array();
  int64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const Tensor host = backend.to_host(*t);
    list.push_back({{"name", name}, {"dtype", static_cast<int>(t->dtype())}, {"shape", t->shape()},
                    {"offset", offset}, {"bytes", t->bytes()},
                    {"crc32c", crc32c_hex(crc32c(host.raw(), static_cast<size_t>(host.bytes())))}});
    offset = align_up(offset + t->bytes(), kAlign);
  }
  header["tensors"] = std::move(list);
  const std::string json = header.dump();
  std::string prefix(kMagic, kMagic + 8);
  put_u32(prefix, kVersion);
  put_u32(prefix, crc32c(json.data(), json.size()));  // the header's own checksum
  put_u64(prefix, json.size());
  prefix += json;
  const int64_t data_start = align_up(static_cast<int64_t>(prefix.size()), kAlign);
  const int64_t needed = data_start + offset;
  const fs::path folder = path.parent_path().empty() ? fs::path(".") : path.parent_path();
  const std::string what = "checkpoint of step " + std::to_string(step) + " (" + std::to_string(needed) + " bytes) into " +
                           folder.string();
  // A folder that cannot hold it is refused before a byte is written (a quota or a racing writer can still fail the
  // write itself: the same message then, and no temporary left).
  std::error_code ec;
  const fs::space_info space = fs::space(folder, ec);
  if (!ec && space.available != static_cast<std::uintmax_t>(-1) && space.available < static_cast<std::uintmax_t>(needed))
    throw SystemError("cannot write the " + what + ": only " + std::to_string(space.available) +
                      " bytes are free there; free space or give another --checkpoint-dir (the previous checkpoint is "
                      "still the latest)");
  try {
    AtomicFile file(path);
    file.write(prefix.data(), static_cast<int64_t>(prefix.size()));
    int64_t pos = data_start;
    pad_to(file, pos);
    for (const auto& [name, t] : tensors) {
      const Tensor host = backend.to_host(*t);  // shares a host tensor; one device tensor's copy at a time
      file.write(host.raw(), host.bytes());
      pos = align_up(pos + t->bytes(), kAlign);
      pad_to(file, pos);
    }
    file.commit();
  } catch (const SystemError& e) {
    throw SystemError("cannot write the " + what + ": " + e.what() +
                      "; free space or give another --checkpoint-dir (the previous checkpoint is still the latest)");
  }
}

bool is_checkpoint_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  char magic[8] = {};
  return in.read(magic, sizeof magic) && std::memcmp(magic, kMagic, sizeof magic) == 0;
}

Checkpoint read_checkpoint(const fs::path& dir_or_file) {
  const fs::path path = fs::is_directory(dir_or_file) ? dir_or_file / kCheckpointFile : dir_or_file;
  const std::string where = "checkpoint " + path.string();
  if (!fs::exists(path)) throw InvalidArgument(where + " does not exist (was --checkpoint-dir written by apart train?)");
  const std::string bytes = read_file_bytes(path, "checkpoint");
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size < 24 || std::memcmp(bytes.data(), kMagic, 8) != 0)
    throw InvalidArgument(where + " is not an apart checkpoint (bad magic)");
  const uint32_t version = static_cast<uint32_t>(get_le(u + 8, 4));
  if (version != 1 && version != kVersion)
    throw InvalidArgument(where + " has format version " + std::to_string(version) + "; this apart reads versions 1 and 2");
  const bool checksummed = version >= 2;
  const uint64_t header_len = get_le(u + 16, 8);
  if (header_len > static_cast<uint64_t>(size - 24)) throw InvalidArgument(where + " is truncated (header)");
  const auto header_crc = static_cast<uint32_t>(get_le(u + 12, 4));
  if (checksummed && crc32c(bytes.data() + 24, header_len) != header_crc)
    throw CorruptData(where + " is damaged: its header fails its checksum (CRC-32C " + crc32c_hex(header_crc) +
                      " stored, its bytes give " + crc32c_hex(crc32c(bytes.data() + 24, header_len)) +
                      "); nothing of it was loaded: resume from another checkpoint");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(24, header_len));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(where + ": header is not valid JSON: " + e.what());
  }
  const int64_t data_start = align_up(24 + static_cast<int64_t>(header_len), kAlign);
  Checkpoint ck;
  const JsonReader r(where, "apart.checkpoint/1", "docs/training.md", JsonReader::Null::kInvalid,
                     ErrorKind::kInvalidArgument, "write it again with apart train --checkpoint-dir");
  if (!header.is_object()) r.fail("the header", "must be a JSON object");
  if (r.string(header, "", "format") != "apart.checkpoint/1") r.fail("format", "is unknown");
  ck.step = r.integer(header, "", "step", 0, limits::kMaxSteps);
  ck.meta = header.contains("meta") ? header["meta"] : nlohmann::json::object();  // the writer's own, any JSON
  const nlohmann::json& list = r.array(header, "", "tensors");
  std::vector<std::pair<int64_t, int64_t>> covered;  // [offset, bytes) of each checksummed tensor
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& e = list[i];
    if (!e.is_object()) r.fail("tensors[" + std::to_string(i) + "]", "must be an object");
    const std::string path = "tensors[" + std::to_string(i) + "].";
    const std::string name = r.string(e, path, "name");
    const auto dtype = dtype_from_onnx(static_cast<int32_t>(r.integer(e, path, "dtype", 0, 1 << 20)));
    std::vector<int64_t> shape;
    const nlohmann::json& dims = r.array(e, path, "shape");
    for (size_t d = 0; d < dims.size(); ++d)
      shape.push_back(r.integer_at(dims[d], path + "shape[" + std::to_string(d) + "]", 0, limits::kMaxByteCount));
    const int64_t offset = r.integer(e, path, "offset", 0, limits::kMaxByteCount);
    const int64_t nbytes = r.integer(e, path, "bytes", 0, limits::kMaxByteCount);
    const auto elements = checked_element_count(shape);
    const auto expected = elements && dtype ? checked_mul(*elements, static_cast<int64_t>(dtype_size(*dtype))) : std::nullopt;
    if (!dtype || dtype_size(*dtype) == 0 || !expected || *expected != nbytes)
      throw InvalidArgument(where + ": tensor '" + name + "' has an inconsistent dtype/shape/size");
    if (offset > size - data_start || nbytes > size - data_start - offset)
      throw InvalidArgument(where + " is truncated: tensor '" + name + "' lies past the end of the file");
    const char* data = bytes.data() + data_start + offset;
    if (checksummed) {
      const std::string stored = r.string(e, path, "crc32c");
      const std::string actual = crc32c_hex(crc32c(data, static_cast<size_t>(nbytes)));
      if (stored != actual)
        throw CorruptData(where + " is damaged: tensor '" + name + "' fails its checksum (CRC-32C " + stored +
                          " stored, its bytes give " + actual + "); nothing of it was loaded: resume from another "
                          "checkpoint");
      covered.emplace_back(offset, nbytes);
    }
    Tensor t(*dtype, shape);
    std::memcpy(t.raw(), data, static_cast<size_t>(nbytes));
    ck.tensors.emplace_back(name, std::move(t));
  }
  if (checksummed) check_padding(bytes, 24 + static_cast<int64_t>(header_len), data_start, std::move(covered), where);
  else
    ck.warning = where + " was written before checkpoints carried checksums (format version 1): its bytes cannot be "
                 "verified; it is loaded as it is (a checkpoint this apart writes is checked on every resume)";
  if (ck.step < 0) throw InvalidArgument(where + ": negative step");
  return ck;
}

void write_trained_model(const fs::path& forward_model, const fs::path& output,
                         const std::map<std::string, const Tensor*>& values, int64_t external_threshold_bytes) {
  onnx::ModelProto model = load_model_proto(forward_model);
  const fs::path base_dir = forward_model.parent_path();
  auto* graph = model.mutable_graph();
  // Trained Constant weights (ImportOptions::constants_as_params) are written back as initializers: the same pass
  // that made them params, applied only when a value names no initializer, so a model without them keeps its nodes.
  {
    std::set<std::string> initializers;
    for (const auto& init : graph->initializer()) initializers.insert(init.name());
    for (const auto& entry : values)
      if (!initializers.count(entry.first)) {
        constants_to_initializers(model);
        break;
      }
  }

  // New contents of every initializer (trained values, or the old ones read back).
  std::set<std::string> seen;
  std::vector<Tensor> contents;
  int64_t total = 0;
  for (const auto& init : graph->initializer()) {
    auto it = values.find(init.name());
    Tensor t;
    if (it != values.end()) {
      t = *it->second;
      // A float16/bfloat16 weight trained in float32 goes back in its stored dtype, rounded to nearest even, so the
      // trained model has the signature of the one given (half_precision.h).
      const auto stored = static_cast<DType>(init.data_type());
      if (is_half(stored) && t.dtype() == DType::kFloat32) t = narrow_from_float32(t, stored);
      if (static_cast<int32_t>(t.dtype()) != init.data_type() ||
          !std::equal(t.shape().begin(), t.shape().end(), init.dims().begin(), init.dims().end()))
        throw InvalidArgument("trained value for '" + init.name() + "' has another dtype/shape than in " +
                              forward_model.string());
      seen.insert(init.name());
    } else {
      t = tensor_from_proto(init, base_dir);
    }
    total += t.bytes();
    contents.push_back(std::move(t));
  }
  for (const auto& [name, t] : values)
    if (!seen.count(name)) throw InvalidArgument("'" + name + "' is not an initializer of " + forward_model.string());

  const bool external = total >= external_threshold_bytes;
  const fs::path data_path = output.string() + ".data";
  std::unique_ptr<AtomicFile> data_file;
  if (external) data_file = std::make_unique<AtomicFile>(data_path);
  int64_t offset = 0;
  for (int i = 0; i < graph->initializer_size(); ++i) {
    onnx::TensorProto& init = *graph->mutable_initializer(i);
    const Tensor& t = contents[static_cast<size_t>(i)];
    onnx::TensorProto fresh;
    tensor_to_proto(t, init.name(), fresh);
    if (init.has_doc_string()) fresh.set_doc_string(init.doc_string());
    if (external) {
      offset = align_up(offset, 4096);
      pad_to(*data_file, offset);
      data_file->write(t.raw(), t.bytes());
      fresh.clear_raw_data();
      fresh.set_data_location(onnx::TensorProto::EXTERNAL);
      auto add = [&](const char* k, const std::string& v) {
        auto* kv = fresh.add_external_data();
        kv->set_key(k);
        kv->set_value(v);
      };
      add("location", data_path.filename().string());
      add("offset", std::to_string(offset));
      add("length", std::to_string(t.bytes()));
      offset += t.bytes();
    }
    init = std::move(fresh);
  }
  std::string serialized;
  if (!model.SerializeToString(&serialized))
    throw Infeasible("the trained model does not serialize (protobuf's 2 GiB limit); use external data");
  AtomicFile out(output);
  out.write(serialized.data(), static_cast<int64_t>(serialized.size()));
  if (data_file) data_file->commit();
  out.commit();
}

CheckpointPiece checkpoint_piece(const std::string& name) {
  const size_t open = name.rfind('[');
  const size_t colon = name.rfind(':');
  if (name.empty() || name.back() != ']' || open == std::string::npos || colon == std::string::npos || colon < open)
    return {name};
  const std::string b = name.substr(open + 1, colon - open - 1), e = name.substr(colon + 1, name.size() - colon - 2);
  auto number = [](const std::string& digits) -> int64_t {
    if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return -1;
    return std::stoll(digits);
  };
  const int64_t begin = number(b), end = number(e);
  if (begin < 0 || end < begin) return {name};
  return {name.substr(0, open), begin, end};
}

WholeCheckpoint assemble_checkpoint_shards(const std::vector<std::filesystem::path>& shards,
                                           const std::map<std::string, std::vector<int64_t>>& param_shapes,
                                           const std::string& where) {
  WholeCheckpoint whole;
  std::map<std::string, int64_t> filled;  // assembled from pieces: elements written
  for (const std::filesystem::path& file : shards) {
    Checkpoint ck = read_checkpoint(file);
    whole.optimizer_steps = ck.meta.value("optimizer_steps", int64_t{0});
    for (auto& [name, t] : ck.tensors) {
      const bool optim = name.rfind("optim/", 0) == 0;
      if (!optim && name.rfind("param/", 0) != 0) continue;
      std::string base = name.substr(6), slot;
      if (optim) {  // "<name>/<slot>": the slot after the last '/' (a param's name may hold '/')
        const size_t cut = base.rfind('/');
        if (cut == std::string::npos) continue;
        slot = base.substr(cut);
        base = base.substr(0, cut);
      }
      const CheckpointPiece piece = checkpoint_piece(base);
      const std::string key = name.substr(0, 6) + piece.param + slot;
      if (piece.begin < 0) {
        whole.tensors.emplace(key, std::move(t));  // replicas hold it alike: the first serves
        continue;
      }
      const auto shape = param_shapes.find(piece.param);
      const int64_t elements = shape == param_shapes.end() ? 0 : checked_element_count(shape->second).value_or(0);
      if (shape == param_shapes.end() || t.dtype() != DType::kFloat32 || piece.end > elements ||
          t.elements() != piece.end - piece.begin)
        throw InvalidArgument(where + ": " + file.string() + " holds " + name + ", which is no piece of a param of its stage");
      Tensor& into = whole.tensors[key];
      if (!into.defined()) into = Tensor(DType::kFloat32, shape->second);
      std::memcpy(into.data<float>() + piece.begin, t.data<float>(), static_cast<size_t>(t.bytes()));
      filled[key] += t.elements();
    }
  }
  for (const auto& [key, n] : filled)
    if (n != whole.tensors.at(key).elements())
      throw InvalidArgument(where + ": the shards hold " + std::to_string(n) + " of the " +
                            std::to_string(whole.tensors.at(key).elements()) + " elements of " + key + " (a shard missing?)");
  return whole;
}

Tensor WholeCheckpoint::cut(const std::string& key, const CheckpointPiece& piece, const std::vector<int64_t>& shape,
                            const std::string& what, const std::string& where) const {
  const auto it = tensors.find(key);
  if (it == tensors.end()) throw InvalidArgument(where + ": the checkpoint holds no " + what);
  const Tensor& t = it->second;
  const int64_t want = checked_element_count(shape).value_or(-1);
  const bool fits = piece.begin < 0 ? t.elements() == want
                                    : t.dtype() == DType::kFloat32 && piece.end <= t.elements() && piece.end - piece.begin == want;
  if (!fits)
    throw InvalidArgument(where + ": the checkpoint's " + what + " holds " + std::to_string(t.elements()) +
                          " elements, not what this plan lays out there");
  return (piece.begin < 0 ? t : t.flat_range(piece.begin, piece.end)).view(shape);
}

}  // namespace apart
