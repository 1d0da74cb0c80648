// placeholder until the rope tests are written
