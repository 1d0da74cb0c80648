#include "reference/cross_entropy.h"
