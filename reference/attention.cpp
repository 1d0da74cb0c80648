#include "reference/attention.h"
