// placeholder until the conv1d tests are written
