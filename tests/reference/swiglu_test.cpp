// placeholder until the swiglu tests are written
