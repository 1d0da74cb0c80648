// placeholder until the gated_delta tests are written
