// Training checkpoints: everything a run needs to continue as if it had never stopped. A checkpoint is a folder
// <save dir>/step-NNNNNNNN holding
//   rank-RRRRR-of-WWWWW.safetensors  one per rank: its rows of every parameter ("param/<name>") and of AdamW's two
//                                    moments ("exp_avg/<name>", "exp_avg_sq/<name>") in the master dtype, and in its
//                                    metadata the row range of every parameter and AdamW's step count;
//   meta.json                        the step, the data cursor, the world size, the run's settings fingerprint, the
//                                    fusepack version, and every rank file's size and checksum;
// and <save dir>/latest names the newest. A save writes into step-NNNNNNNN.tmp, fsyncs every file, renames the folder
// into place, then rewrites `latest` (atomically): a crash at any moment leaves the previous checkpoint and `latest`
// intact, and the next save removes the .tmp folder it left. No random state is saved: the model draws none, and the
// data order is a function of the seed and the epoch.
#pragma once

#include "trainer/optim/adamw.h"
#include "trainer/optim/parameters.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace fusepack::parallel {
class Collectives;
}

namespace fusepack::train {

// Where the run stands between two steps.
struct TrainingProgress {
  std::int64_t steps_taken = 0;         // optimizer steps done
  std::uint64_t epochs_started = 0;     // epoch plans drawn so far (the current one is epochs_started - 1)
  std::int64_t next_micro_batch = 0;    // the next plan entry of the current epoch
  std::string checkpoint;               // load_training_checkpoint: the folder it loaded
};

// One trainable tensor of this rank: rows [row_begin, row_begin + param.size(0)) of a parameter of `rows` rows.
struct ParameterRows {
  std::string name;
  at::Tensor param;  // this rank's rows (the whole parameter in one process)
  std::int64_t row_begin = 0;
  std::int64_t rows = 0;
};

struct SaveOptions {
  std::string dir;       // the save dir (created if needed)
  std::int64_t keep = 3; // >= 1: the newest checkpoints kept; older ones are removed after a save succeeds
};

// Saves this rank's part; collective when `comm` is given (every rank calls it at the same step; rank 0 writes
// meta.json and `latest`). `fingerprint`: the run's settings as JSON text (compared on resume). Returns the checkpoint
// folder. Throws std::runtime_error naming the file that could not be written (on every rank when one fails).
std::string save_training_checkpoint(SaveOptions const& options, TrainingProgress const& progress,
                                     std::vector<ParameterRows> const& params, optim::AdamW const& adamw,
                                     std::string const& fingerprint, parallel::Collectives* comm);

// `path`: a checkpoint folder, or a save dir whose `latest` names one. Every file it reads is checked against
// meta.json's size and checksum first. Fills `params` (this rank's rows, from whichever ranks' files hold them: any
// world size loads any other) and `adamw`'s state; returns the progress. Throws std::invalid_argument naming the file
// and the problem: no checkpoint there, a missing, truncated or damaged file, a checkpoint of other settings (each
// difference named; the fusepack version alone may differ), a parameter it lacks or holds in another shape.
TrainingProgress load_training_checkpoint(std::string const& path, std::vector<ParameterRows> const& params,
                                          optim::AdamW& adamw, std::string const& fingerprint);

// The checkpoint folder `path` (a folder or a save dir with `latest`) resolves to; throws std::invalid_argument.
std::string resolve_checkpoint(std::string const& path);

}  // namespace fusepack::train
