"""POST /orders/?customer=NAME creates an order and enqueues its receipt e-mail;
GET /results/<id>/ shows a task result."""

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from shop.models import Order
from shop.tasks import send_receipt


@csrf_exempt
def create_order(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(customer=request.GET.get("customer", "anonymous"))
        result = send_receipt.enqueue(order.pk)  # stored when the transaction commits
    return JsonResponse({"order": order.pk, "result_id": result.id}, status=201)


def show_result(request: HttpRequest, result_id: str) -> JsonResponse:
    result = send_receipt.get_result(result_id)
    done = result.status == "SUCCESSFUL"
    return JsonResponse({"status": result.status, "value": result.return_value if done else None})


urlpatterns = [
    path("orders/", create_order),
    path("results/<str:result_id>/", show_result),
]
