#include "reference/conv1d.h"
