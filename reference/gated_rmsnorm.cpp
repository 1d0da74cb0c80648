#include "reference/gated_rmsnorm.h"
