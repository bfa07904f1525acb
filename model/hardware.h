// The hardware profile: what one host with N GPUs can do, in the units the step model needs.
// Presets (model/presets/hardware/*.yaml, every value with its source) and profiles written by
// slidedp-profile share this schema. Rates are decimal GB/s and FLOP/s.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "card/unit_layout.h"
#include "model/optimizer_states.h"

namespace slidedp {

struct GpuSpec {
  std::string model;               // "H100 SXM"
  int count = 1;                   // GPUs in the host
  int64_t mem_bytes = 0;           // device memory per GPU
  double bf16_peak_flops = 0;      // dense bf16 with fp32 accumulation, datasheet
  double matmul_efficiency = 0.7;  // achieved / peak for layer-sized GEMMs
  double attention_efficiency = 0.45;
  double hbm_gbps = 0;             // device memory bandwidth (elementwise work)
  double kernel_overhead_s = 0;    // fixed time per unit pass (launches, small kernels)
  // Attention as one fused kernel (FlashAttention, sm_80 and later): the T x T scores never leave the
  // chip. false (V100 and the frameworks of its era): the scores are written, soft-maxed and dropped
  // out through device memory, which the elementwise term charges.
  bool fused_attention = true;
  // CPU backend: "devices" are threads of this host. Their compute then occupies host cores and their
  // copies are memcpy through host memory, so the model charges those shared resources as well.
  bool emulated_on_host = false;
  int host_threads_per_device = 1;
  // Device memory outside our buffers, which only a GPU can measure (slidedp-profile writes them; the
  // defaults are published figures, see default_runtime_bytes): the CUDA context with the libraries'
  // handles, and NCCL's buffers of one communicator (its channels x peers x protocols).
  int64_t runtime_bytes = 0;
  int64_t collective_bytes = 0;
};

// Published figures used until a profile measures them. CUDA context and cuBLASLt handle: about 0.5
// GiB on Hopper with lazy module loading (CUDA 12+). NCCL: 1-1.6 GB for one communicator doing
// collectives over NVLink's many channels (NVIDIA/nccl issues 864 and 1685); a PCIe ring uses few
// channels, so a quarter of that. Emulated devices: none.
int64_t default_runtime_bytes(const GpuSpec& gpu);
int64_t default_collective_bytes(const GpuSpec& gpu, const std::string& fabric_kind);

struct HostLinkSpec {
  double h2d_gbps = 0;        // one GPU copying alone, pinned memory
  double d2h_gbps = 0;
  double h2d_all_gbps = 0;    // per GPU while all GPUs copy in the same direction at once
  double d2h_all_gbps = 0;
  double h2d_bidir_gbps = 0;  // per GPU while all GPUs copy in both directions at once
  double d2h_bidir_gbps = 0;
  double latency_s = 10e-6;   // per copy (issue + completion)
};

struct FabricSpec {
  std::string kind = "nvlink";  // nvlink | pcie_p2p | via_host | none
  double allgather_busbw_gbps = 0;       // NCCL bus bandwidth (nccl-tests definition)
  double reduce_scatter_busbw_gbps = 0;
  double latency_s = 20e-6;     // per collective call
  // via_host: no peer-to-peer path; collective bytes cross the host links and host memory too.
  bool via_host() const { return kind == "via_host"; }
};

// The network between nodes of a cluster of such hosts (slidedp-plan's `nodes`): what one node's NICs
// carry together, per direction, and the latency of one message. 0: no network described (one node).
struct NetworkSpec {
  double nic_gbps = 0;
  double latency_s = 5e-6;
};

struct HostSpec {
  double mem_bw_gbps = 0;        // sustained host-memory bandwidth shared by DMA, reduction, AdamW
  int64_t ram_bytes = 0;
  int64_t pinned_limit_bytes = 0;  // how much may be page-locked
};

// A measured rate at a thread count; a table of them is interpolated piecewise-linearly.
struct RatePoint {
  int threads = 1;
  double rate = 0;
};

// Whose CPU optimizer a system runs (their rates differ on one host: cpu_optimizer_rates).
enum class CpuOptimizer { kSlideDP, kDeepSpeed, kTorch };

struct CpuSpec {
  std::string model;
  int cores = 1;
  std::vector<RatePoint> adamw_params_per_s;  // fused AdamW with bf16 grads and bf16 mirror
  std::vector<RatePoint> reduce_gbps;         // N-way bf16 -> fp32 reduction, input bytes/s
  double convert_gbps_per_thread = 10.0;      // fp32 -> bf16 conversion (SlideFormer's per-load step)
  // Other implementations' CPU optimizer rates, parameters per second by threads: DeepSpeed's CPU
  // Adam (ZeRO-Offload, ZeRO-3 offload, MegaTrain, SlideFormer) and torch's CPU AdamW (FSDP with CPU
  // offload). Empty in the file: derived from adamw_params_per_s (cpu_optimizer_rates, hardware.cc).
  std::vector<RatePoint> deepspeed_adam_params_per_s;
  std::vector<RatePoint> torch_adamw_params_per_s;
  // SlideDP's kernel with lossy moments (more arithmetic per parameter: rounding, or decoding and
  // encoding blocks), parameters per second by threads. Empty in the file: ours times the ratio
  // measured at a cache-resident size (kBf16MomentsVsOurs, k8bitMomentsVsOurs, hardware.cc).
  std::vector<RatePoint> adamw_bf16_moments_params_per_s;
  std::vector<RatePoint> adamw_8bit_moments_params_per_s;
  // Rate at `threads` (interpolated; flat beyond the table's last point). Aborts on an empty table.
  static double interpolate(const std::vector<RatePoint>& table, double threads);
  // The rate table of `which`: the file's, or for DeepSpeed's and torch's when the file has none, ours
  // times the ratio the published comparisons give (kDeepSpeedAdamVsOurs, hardware.cc).
  std::vector<RatePoint> optimizer_rates(CpuOptimizer which) const;
  // SlideDP's rate table for its moments' format.
  std::vector<RatePoint> slidedp_rates(OptimizerStates moments) const;
};

// Measured compute time of one unit kind for one model (from slidedp-profile):
// seconds = fixed_s + per_token_s * tokens + per_token_ctx_s * tokens * seq_len.
struct TimeFit {
  double fixed_s = 0;
  double per_token_s = 0;
  double per_token_ctx_s = 0;
  double eval(double tokens, double seq_len) const {
    return fixed_s + per_token_s * tokens + per_token_ctx_s * tokens * seq_len;
  }
};
struct UnitTimeProfile {
  std::string model;  // model card name the fit belongs to
  UnitKind unit = UnitKind::kDecoder;
  TimeFit forward;
  TimeFit backward;
  TimeFit recompute;
  // Decoder units of a model whose layers differ (Gemma 4's sliding and full attention, Qwen3.6's
  // linear and full): the layer type these times are for. None: every layer of the model.
  std::optional<AttentionKind> layer_type;
};

// What a synchronous step pays beyond the pipeline the model schedules: the hand-off latency
// between the ranks' threads and the straggler effect (every collective waits for the slowest of N
// ranks, and the expected maximum of N Gaussian jitters grows as sqrt(2 ln N)). A step of N ranks
// takes (1 + base + straggler * sqrt(2 ln N)) times its pipeline time; the difference is reported
// as synchronisation. Presets and fresh profiles leave both 0 (not measured); `slidedp-sweep
// fidelity` fits them against measured runs and writes them into its calibrated profile.
struct SyncSpec {
  static constexpr double kMax = 10.0;  // the schema's limit on either term
  double base = 0;       // fraction of the step, any rank count
  double straggler = 0;  // fraction of the step per unit of sqrt(2 ln N)
  double factor(int ranks) const;
};

struct Hardware {
  std::string name;
  std::string description;
  GpuSpec gpu;
  HostLinkSpec link;
  FabricSpec fabric;
  HostSpec host;
  CpuSpec cpu;
  NetworkSpec network;
  std::vector<UnitTimeProfile> unit_times;
  SyncSpec sync;
  std::map<std::string, std::string> sources;  // key path -> where the value came from

  const UnitTimeProfile* find_unit_time(const std::string& model, UnitKind unit,
                                        std::optional<AttentionKind> layer_type = std::nullopt) const;
  void validate(const std::string& origin) const;
};

std::vector<std::string> hardware_preset_names();
bool is_hardware_preset(const std::string& name);
Hardware hardware_preset(const std::string& name);
// A preset name or a YAML file (preset or profile schema). Throws InputError / IoError.
Hardware load_hardware(const std::string& name_or_path);
Hardware hardware_from_yaml(const std::string& yaml_text, const std::string& origin);
std::string hardware_to_yaml(const Hardware& hw);

}  // namespace slidedp
