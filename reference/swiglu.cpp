#include "reference/swiglu.h"
