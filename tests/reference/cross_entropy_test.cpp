// placeholder until the cross_entropy tests are written
