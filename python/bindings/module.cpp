// flash_kda._core: the nanobind extension. Thin: converts DLPack arrays (or, on the fast path,
// raw descriptions of CUDA torch tensors) to TensorViews, fills a ForwardArgs and calls the C++
// API (include/flash_kda/forward.h). Policy that needs torch (the workspace allocator, the
// current stream) lives in python/flash_kda/ so this module never links against PyTorch.
#include <cstdint>
#include <optional>
#include <string>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#if FLASH_KDA_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "flash_kda/flash_kda.h"
#include "tensor_view.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace flash_kda::python {
namespace {

using In = nb::ndarray<nb::ro>;
using Out = nb::ndarray<>;
using OptIn = std::optional<In>;
using OptOut = std::optional<Out>;

/// The eleven arrays of one call, in API order (forward_raw's descriptions come in this order).
constexpr const char* kArrayNames[] = {"q",     "k",       "v",          "g",             "beta",       "out",
                                       "A_log", "dt_bias", "cu_seqlens", "initial_state", "final_state"};
constexpr size_t kArrays = sizeof(kArrayNames) / sizeof(kArrayNames[0]);

/// ForwardArgs from the arrays' views in kArrayNames order: the one place that maps them to
/// fields, for the DLPack path, the raw path and the reference.
ForwardArgs args_from_views(const TensorView (&v)[kArrays], std::optional<double> scale, double lower_bound) {
  ForwardArgs a;
  a.q = v[0]; a.k = v[1]; a.v = v[2]; a.g = v[3]; a.beta = v[4]; a.out = v[5];
  a.A_log = v[6]; a.dt_bias = v[7]; a.cu_seqlens = v[8]; a.initial_state = v[9]; a.final_state = v[10];
  a.scale = scale;
  a.lower_bound = lower_bound;
  return a;
}

/// DLPack arrays of one call; the same for the GPU path and the reference.
ForwardArgs make_args(const In& q, const In& k, const In& v, const In& g, const In& beta, const Out& out,
                      const OptIn& A_log, const OptIn& dt_bias, const OptIn& cu_seqlens,
                      const OptIn& initial_state, const OptOut& final_state, std::optional<double> scale,
                      double lower_bound) {
  const TensorView views[kArrays] = {
      to_view(q, kArrayNames[0]),          to_view(k, kArrayNames[1]),       to_view(v, kArrayNames[2]),
      to_view(g, kArrayNames[3]),          to_view(beta, kArrayNames[4]),    to_view(out, kArrayNames[5]),
      to_view(A_log, kArrayNames[6]),      to_view(dt_bias, kArrayNames[7]), to_view(cu_seqlens, kArrayNames[8]),
      to_view(initial_state, kArrayNames[9]), to_view(final_state, kArrayNames[10])};
  return args_from_views(views, scale, lower_bound);
}

GateMode parse_gate(const std::string& s) {
  if (s == "safe") return GateMode::SafeSigmoid;
  if (s == "softplus") return GateMode::Softplus;
  if (s == "none") return GateMode::PreGated;
  throw Error("gate", "one of 'safe', 'softplus', 'none', got '" + s + "'");
}

StateLayout parse_layout(const std::string& s) {
  if (s == "v_first") return StateLayout::VFirst;
  if (s == "k_first") return StateLayout::KFirst;
  throw Error("state_layout", "'v_first' or 'k_first', got '" + s + "'");
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

/// GPU forward. `alloc(nbytes)` returns a uint8 device array of at least nbytes (the caller's
/// allocator, so CUDA-graph capture sees a stream-ordered allocation); `stream` is a
/// cudaStream_t as an integer.
void forward_py(const In& q, const In& k, const In& v, const In& g, const In& beta, const Out& out,
                const OptIn& A_log, const OptIn& dt_bias, const OptIn& cu_seqlens,
                const OptIn& initial_state, const OptOut& final_state, std::optional<double> scale,
                double lower_bound, const nb::callable& alloc, uintptr_t stream) {
  const ForwardArgs args = make_args(q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state,
                                     final_state, scale, lower_bound);
  const size_t need = forward_workspace_size(args);  // validates: throws before any allocation
  nb::object ws_obj = alloc(need);
  const Out ws = nb::cast<Out>(ws_obj);
  const TensorView w = to_view(ws, "workspace");
  const size_t have = static_cast<size_t>(w.numel()) * static_cast<size_t>(dtype_size(w.dtype));
  nb::gil_scoped_release release;
  forward(args, w.data, have, reinterpret_cast<Stream>(stream));
}

/// GPU forward on raw tensor descriptions (raw_view), the same order as forward_py's arrays:
/// q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state, final_state. `alloc(nbytes)`
/// returns a uint8 CUDA torch tensor of at least nbytes; it is kept alive until the launches
/// are enqueued (later use is stream-ordered, as for any torch temporary).
void forward_raw_py(const nb::tuple& raw, std::optional<double> scale, double lower_bound, const nb::callable& alloc,
                    uintptr_t stream) {
  if (nb::len(raw) != kArrays) throw Error("forward_raw", "11 tensor descriptions");
  TensorView views[kArrays];
  for (size_t i = 0; i < kArrays; ++i) views[i] = raw_view(raw[i], kArrayNames[i]);
  const ForwardArgs a = args_from_views(views, scale, lower_bound);
  const size_t need = forward_workspace_size(a);  // validates: throws before any allocation
  nb::object ws = alloc(need);
  void* data = reinterpret_cast<void*>(nb::cast<uintptr_t>(ws.attr("data_ptr")()));
  const size_t have = nb::cast<size_t>(ws.attr("numel")());
  nb::gil_scoped_release release;
  forward(a, data, have, reinterpret_cast<Stream>(stream));
}

void reference_py(const In& q, const In& k, const In& v, const In& g, const In& beta, const Out& out,
                  const OptIn& A_log, const OptIn& dt_bias, const OptIn& cu_seqlens,
                  const OptIn& initial_state, const OptOut& final_state, std::optional<double> scale,
                  double lower_bound, const std::string& gate, const std::string& state_layout,
                  bool use_qk_l2norm, bool use_beta_sigmoid, bool allow_neg_eigval, int num_threads) {
  ForwardArgs args = make_args(q, k, v, g, beta, out, A_log, dt_bias, cu_seqlens, initial_state,
                               final_state, scale, lower_bound);
  args.gate = parse_gate(gate);
  args.state_layout = parse_layout(state_layout);
  args.use_qk_l2norm = use_qk_l2norm;
  args.use_beta_sigmoid = use_beta_sigmoid;
  args.allow_neg_eigval = allow_neg_eigval;
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

  m.def("forward", &forward_py, "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "out"_a, "A_log"_a.none(),
        "dt_bias"_a.none(), "cu_seqlens"_a.none(), "initial_state"_a.none(), "final_state"_a.none(),
        "scale"_a.none(), "lower_bound"_a, "alloc"_a, "stream"_a,
        "flash_kda::forward on DLPack arrays; see flash_kda.fwd.");

  m.def("forward_raw", &forward_raw_py, "tensors"_a, "scale"_a.none(), "lower_bound"_a, "alloc"_a, "stream"_a,
        "flash_kda::forward on raw CUDA tensor descriptions (data_ptr, dtype code, shape, strides, "
        "device_id) or None; flash_kda.fwd's fast path for torch tensors.");
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

  m.def("reference_forward", &reference_py, "q"_a, "k"_a, "v"_a, "g"_a, "beta"_a, "out"_a,
        "A_log"_a.none(), "dt_bias"_a.none(), "cu_seqlens"_a.none(), "initial_state"_a.none(),
        "final_state"_a.none(), "scale"_a.none(), "lower_bound"_a, "gate"_a, "state_layout"_a,
        "use_qk_l2norm"_a, "use_beta_sigmoid"_a, "allow_neg_eigval"_a, "num_threads"_a,
        "flash_kda::reference_forward on host DLPack arrays; see flash_kda.reference.");
}
