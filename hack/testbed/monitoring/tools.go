//go:build tools

// Package tools keeps the monitoring/v1 API types (ServiceMonitor, PodMonitor,
// PrometheusRule, ...) in this module's build list, for controller-gen to load.
package tools

import _ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
