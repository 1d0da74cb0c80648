#include "reference/gated_delta.h"
