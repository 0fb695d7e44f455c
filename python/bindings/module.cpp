// flash_kda._core: the nanobind extension. Thin: converts the tensors of a call, in the order
// of the call table (flash_kda/call_table.h, exported as forward_tensors), from DLPack arrays
// or, on the fast path, raw descriptions of torch tensors to TensorViews, fills a ForwardArgs
// and calls the C++ API (include/flash_kda/forward.h); the decode call's functions are in
// decode.cpp. Policy that needs torch (the workspace allocator, the current stream) lives in
// python/flash_kda/ so this module never links against PyTorch.
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "backward_binding.h"
#include "decode_binding.h"
#include "flash_kda/flash_kda.h"
#include "parse.h"
#include "tensor_view.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace flash_kda::python {
namespace {

/// LaunchOptions as flash_kda.fwd passes them: (num_sms, window_slots, segments,
/// recurrence_warps), types checked in Python (flash_kda.LaunchOptions).
using RawOptions = std::optional<std::tuple<int, int64_t, int, int>>;

LaunchOptions launch_options(const RawOptions& raw) {
  LaunchOptions o;
  if (raw) std::tie(o.num_sms, o.window_slots, o.segments, o.recurrence_warps) = *raw;
  return o;
}

void check_count(const nb::tuple& tensors) {
  if (nb::len(tensors) != kForwardTensorCount)
    throw Error("tensors", "expected " + std::to_string(kForwardTensorCount) + " entries in the order of forward_tensors, got " +
                               std::to_string(nb::len(tensors)));
}

/// ForwardArgs from DLPack arrays (or None) in call-table order; the arrays stay in `keep`.
ForwardArgs args_from_arrays(const nb::tuple& tensors, Target target, Imported& keep) {
  check_count(tensors);
  ForwardArgs a;
  for (size_t i = 0; i < kForwardTensorCount; ++i)
    a.*(kForwardTensors[i].member) = to_view(tensors[i], kForwardTensors[i], target, keep);
  return a;
}

/// ForwardArgs from raw descriptions (or None) in call-table order.
ForwardArgs args_from_raw(const nb::tuple& tensors) { return forward_args_from_raw(tensors); }

/// The forward's scalar settings as the Python functions pass them: gate ("safe", "softplus",
/// "none"), state_layout ("v_first", "k_first") and the flags, with the names of
/// reference_forward's arguments. flash_kda.fwd leaves them at FlashKDA's call (the defaults).
struct Settings {
  std::optional<double> scale;
  double lower_bound = -5.0;
  std::string gate = "safe";
  std::string state_layout = "v_first";
  bool use_qk_l2norm = true;
  bool use_beta_sigmoid = true;
  bool allow_neg_eigval = false;
  int64_t intermediate_every = 0;            // tokens between intermediate states (forward.h)
  bool intermediate_include_initial = true;  // row 0 of each sequence is its start state
};

/// Copies `s` into `a`; an unknown gate or layout is a flash_kda::Error naming it.
void apply(ForwardArgs& a, const Settings& s) {
  a.scale = s.scale;
  a.lower_bound = s.lower_bound;
  a.gate = parse_gate(s.gate);
  a.state_layout = parse_layout(s.state_layout);
  a.use_qk_l2norm = s.use_qk_l2norm;
  a.use_beta_sigmoid = s.use_beta_sigmoid;
  a.allow_neg_eigval = s.allow_neg_eigval;
  a.intermediate_every = s.intermediate_every;
  a.intermediate_include_initial = s.intermediate_include_initial;
}

bool cuda_available() noexcept {
#if FLASH_KDA_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: clear the sticky-free error and say no
    return false;
  }
  for (int i = 0; i < n; ++i) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    if (major == 9 && minor == 0) return true;
  }
#endif
  return false;
}

/// flash_kda::forward with the workspace from `alloc(nbytes)`, a Python callable returning a
/// uint8 CUDA torch tensor of at least nbytes from the caller's stream-ordered allocator (so
/// CUDA-graph capture sees the allocation). Validation and the launch plan run once, inside
/// forward(), before the allocation; the tensor is held until the launches are enqueued
/// (later use is stream-ordered, as for any torch temporary).
void run_forward(ForwardArgs& a, const Settings& s, const nb::callable& alloc, uintptr_t stream,
                 const RawOptions& options) {
  apply(a, s);
  const LaunchOptions o = launch_options(options);
  nb::object workspace;
  // The GIL stays held: the call validates, plans and enqueues (microseconds, no waiting), and
  // the allocator is Python; releasing it around forward() would hand it off twice a call.
  const WorkspaceAllocator allocate = [&](size_t bytes) -> void* {
    workspace = alloc(bytes);
    return reinterpret_cast<void*>(nb::cast<uintptr_t>(workspace.attr("data_ptr")()));
  };
  forward(a, allocate, reinterpret_cast<Stream>(stream), o);
}

Settings settings(std::optional<double> scale, double lower_bound, std::string gate, std::string state_layout,
                  bool use_qk_l2norm, bool use_beta_sigmoid, bool allow_neg_eigval, int64_t intermediate_every = 0,
                  bool intermediate_include_initial = true) {
  return Settings{scale,          lower_bound,     std::move(gate),  std::move(state_layout), use_qk_l2norm,
                  use_beta_sigmoid, allow_neg_eigval, intermediate_every, intermediate_include_initial};
}

/// GPU forward on DLPack arrays (or None), in call-table order.
void forward_py(const nb::tuple& tensors, std::optional<double> scale, double lower_bound, const nb::callable& alloc,
                uintptr_t stream, const RawOptions& options, std::string gate, std::string state_layout,
                bool use_qk_l2norm, bool use_beta_sigmoid, bool allow_neg_eigval, int64_t intermediate_every,
                bool intermediate_include_initial) {
  Imported keep;
  ForwardArgs a = args_from_arrays(tensors, Target::Sm90, keep);
  run_forward(a, settings(scale, lower_bound, std::move(gate), std::move(state_layout), use_qk_l2norm, use_beta_sigmoid,
                          allow_neg_eigval, intermediate_every, intermediate_include_initial),
              alloc, stream, options);
}

/// GPU forward on raw tensor descriptions (raw_view), in call-table order.
void forward_raw_py(const nb::tuple& tensors, std::optional<double> scale, double lower_bound, const nb::callable& alloc,
                    uintptr_t stream, const RawOptions& options, std::string gate, std::string state_layout,
                    bool use_qk_l2norm, bool use_beta_sigmoid, bool allow_neg_eigval, int64_t intermediate_every,
                    bool intermediate_include_initial) {
  ForwardArgs a = args_from_raw(tensors);
  run_forward(a, settings(scale, lower_bound, std::move(gate), std::move(state_layout), use_qk_l2norm, use_beta_sigmoid,
                          allow_neg_eigval, intermediate_every, intermediate_include_initial),
              alloc, stream, options);
}

nb::tuple shape_tuple(const ProblemShape& p) {
  return nb::make_tuple(p.batch, p.seqlen, p.num_seqs, p.heads, p.value_heads, p.head_dim_k, p.head_dim_v, p.varlen,
                        p.scale);
}

/// flash_kda::validate_forward on raw descriptions: what forward_raw would check, without the
/// allocator, the stream or a launch. Reads no tensor data except a host cu_seqlens_cpu.
nb::tuple validate_forward_raw_py(const nb::tuple& tensors, std::optional<double> scale, double lower_bound,
                                  std::string gate, std::string state_layout, bool use_qk_l2norm,
                                  bool use_beta_sigmoid, bool allow_neg_eigval, const RawOptions& options,
                                  int64_t intermediate_every, bool intermediate_include_initial) {
  ForwardArgs a = args_from_raw(tensors);
  apply(a, settings(scale, lower_bound, std::move(gate), std::move(state_layout), use_qk_l2norm, use_beta_sigmoid,
                    allow_neg_eigval, intermediate_every, intermediate_include_initial));
  return shape_tuple(validate_forward(a, launch_options(options)));
}

void reference_py(const nb::tuple& tensors, std::optional<double> scale, double lower_bound, const std::string& gate,
                  const std::string& state_layout, bool use_qk_l2norm, bool use_beta_sigmoid, bool allow_neg_eigval,
                  int num_threads, int64_t intermediate_every, bool intermediate_include_initial) {
  Imported keep;
  ForwardArgs args = args_from_arrays(tensors, Target::CpuReference, keep);
  apply(args, settings(scale, lower_bound, gate, state_layout, use_qk_l2norm, use_beta_sigmoid, allow_neg_eigval,
                       intermediate_every, intermediate_include_initial));
  nb::gil_scoped_release release;  // seconds of pure C++ at T = 8192
  reference_forward(args, num_threads);
}

}  // namespace
}  // namespace flash_kda::python

NB_MODULE(_core, m) {
  using namespace flash_kda::python;
  m.doc() = "flash_kda's compiled core; use the functions of the flash_kda package instead.";
  m.attr("__version__") = flash_kda::kVersion;
#if FLASH_KDA_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif

  // flash_kda::Error -> flash_kda.Error (a ValueError) carrying the argument's name as .argument.
  // Held for the life of the process on purpose: a static nb::object would be released after
  // the interpreter is finalised.
  static nb::handle error_type = nb::handle(
      PyErr_NewExceptionWithDoc("flash_kda.Error",
                                "Invalid or unsupported argument to a flash_kda call. The message reads "
                                "'flash_kda: <argument>: <what was expected>'; .argument is the name.",
                                PyExc_ValueError, nullptr));
  m.attr("Error") = error_type;
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void*) {
        try {
          std::rethrow_exception(p);
        } catch (const flash_kda::Error& e) {
          nb::object exc = error_type(nb::str(e.what()));
          nb::setattr(exc, "argument", nb::str(e.argument().c_str()));
          PyErr_SetObject(error_type.ptr(), exc.ptr());
        }
      });

  m.def("cuda_available", &cuda_available,
        "True when the CUDA kernels were built and an sm_90 device is visible. Never raises.");

  {
    nb::list names;  // the call table's order: every tensors tuple below follows it
    for (const flash_kda::TensorSpec& spec : flash_kda::kForwardTensors) names.append(spec.name);
    m.attr("forward_tensors") = nb::tuple(names);
  }

  // The settings after launch_options default to FlashKDA's call (flash_kda.fwd passes none).
  m.def("forward", &forward_py, "tensors"_a, "scale"_a.none(), "lower_bound"_a, "alloc"_a, "stream"_a,
        "launch_options"_a.none(), "gate"_a = "safe", "state_layout"_a = "v_first", "use_qk_l2norm"_a = true,
        "use_beta_sigmoid"_a = true, "allow_neg_eigval"_a = false, "intermediate_every"_a = 0,
        "intermediate_include_initial"_a = true,
        "flash_kda::forward on DLPack arrays (or None), one per name of forward_tensors; see flash_kda.fwd. "
        "gate: 'safe', 'softplus' or 'none'; state_layout: 'v_first' or 'k_first'.");

  m.def("forward_raw", &forward_raw_py, "tensors"_a, "scale"_a.none(), "lower_bound"_a, "alloc"_a, "stream"_a,
        "launch_options"_a.none(), "gate"_a = "safe", "state_layout"_a = "v_first", "use_qk_l2norm"_a = true,
        "use_beta_sigmoid"_a = true, "allow_neg_eigval"_a = false, "intermediate_every"_a = 0,
        "intermediate_include_initial"_a = true,
        "flash_kda::forward on raw torch tensor descriptions (data_ptr, dtype code, shape, strides, "
        "device_id; -1 for host memory) or None, one per name of forward_tensors; flash_kda.fwd's fast path. "
        "Settings as forward's.");

  m.def("validate_forward_raw", &validate_forward_raw_py, "tensors"_a, "scale"_a.none(), "lower_bound"_a, "gate"_a,
        "state_layout"_a, "use_qk_l2norm"_a, "use_beta_sigmoid"_a, "allow_neg_eigval"_a,
        "launch_options"_a.none() = nb::none(), "intermediate_every"_a = 0, "intermediate_include_initial"_a = true,
        "flash_kda::validate_forward on raw descriptions (as forward_raw): everything forward_raw checks "
        "before it launches, nothing launched or allocated. Returns (batch, seqlen, num_seqs, heads, "
        "value_heads, K, V, varlen, scale) or raises flash_kda.Error. Reads no device memory, so the "
        "descriptions' data pointers need only be aligned and apart, not real.");
  {
    nb::dict codes;  // torch dtype name -> flash_kda::DType value, for forward_raw's descriptions
    codes["bfloat16"] = static_cast<int>(flash_kda::DType::BF16);
    codes["float16"] = static_cast<int>(flash_kda::DType::F16);
    codes["float32"] = static_cast<int>(flash_kda::DType::F32);
    codes["float64"] = static_cast<int>(flash_kda::DType::F64);
    codes["int32"] = static_cast<int>(flash_kda::DType::I32);
    codes["int64"] = static_cast<int>(flash_kda::DType::I64);
    codes["uint8"] = static_cast<int>(flash_kda::DType::U8);
    m.attr("dtype_codes") = codes;
  }

  m.def("reference_forward", &reference_py, "tensors"_a, "scale"_a.none(), "lower_bound"_a, "gate"_a,
        "state_layout"_a, "use_qk_l2norm"_a, "use_beta_sigmoid"_a, "allow_neg_eigval"_a, "num_threads"_a,
        "intermediate_every"_a = 0, "intermediate_include_initial"_a = true,
        "flash_kda::reference_forward on host DLPack arrays (or None), one per name of forward_tensors; "
        "see flash_kda.reference.");

  bind_decode(m);
  bind_backward(m);
}
