from django.urls import path
from shop import views

urlpatterns = [
    path("orders/", views.create_order),
    path("orders/<int:order_id>/", views.order),
    path("threads/<str:thread_id>/", views.thread),
]
