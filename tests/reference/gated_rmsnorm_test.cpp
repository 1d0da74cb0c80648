// placeholder until the gated_rmsnorm tests are written
