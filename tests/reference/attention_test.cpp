// placeholder until the attention tests are written
